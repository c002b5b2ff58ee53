"""The Redis and PostgreSQL servers tests start for themselves: they answer, survive a crash and
a restart with their data, and leave no process behind."""

from __future__ import annotations

import os
import subprocess

from edgectl.local_services import PostgresServer, RedisServer


def redis_cli(server: RedisServer, *args: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(server.port), "-a", server.password, "--no-auth-warning", *args],
        capture_output=True,
        text=True,
        timeout=10,
    )
    return done.stdout.strip()


def psql(server: PostgresServer, sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["psql", "-h", "127.0.0.1", "-p", str(server.port), "-U", "edge", "edge", "-tAc", sql],
        env={**os.environ, "PGPASSWORD": server.password},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_redis_keeps_what_it_was_told_across_a_crash(redis_server):
    assert redis_cli(redis_server, "set", "k", "v") == "OK"
    redis_server.kill()
    assert redis_cli(redis_server, "ping") != "PONG"
    redis_server.restart()
    assert redis_cli(redis_server, "get", "k") == "v"


def test_redis_refuses_a_client_without_its_password(redis_server):
    done = subprocess.run(
        ["redis-cli", "-p", str(redis_server.port), "get", "k"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert "NOAUTH" in done.stdout + done.stderr


def test_postgres_recovers_committed_rows_after_a_crash(postgres_server):
    assert psql(postgres_server, "create table t (v int); insert into t values (7)").returncode == 0
    postgres_server.kill()
    assert psql(postgres_server, "select 1").returncode != 0
    postgres_server.restart()
    assert psql(postgres_server, "select v from t").stdout.strip() == "7"


def test_postgres_refuses_a_wrong_password(postgres_server):
    done = subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            str(postgres_server.port),
            "-U",
            "edge",
            "edge",
            "-c",
            "select 1",
        ],
        env={**os.environ, "PGPASSWORD": "wrong"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0 and "password authentication failed" in done.stderr


def test_a_removed_server_leaves_no_process(redis_server, postgres_server):
    pids = [redis_server.process.pid, postgres_server.process.pid]
    redis_server.remove()
    postgres_server.remove()
    for pid in pids:
        state = subprocess.run(
            ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True
        )
        assert state.stdout.strip() in ("", "Z"), f"process {pid} still running"
