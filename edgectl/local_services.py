"""Redis and PostgreSQL servers of our own on this machine, for tests and benchmarks: Debian's
`redis-server` and PostgreSQL binaries, each in its own temp dir on a free loopback port and in a
process group of its own, so stopping (or killing) one never touches the system's services or
another run's. `kill()` is a real failure (SIGKILL, no goodbye); `restart()` brings the same
server back on the same port and data dir."""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from edgectl.processes import free_port, wait_until

START_TIMEOUT_S = 60
STOP_GRACE_S = 10
# PostgreSQL refuses to run as root; as root we run it as Debian's `postgres` user.
POSTGRES_OS_USER = "postgres"
POSTGRES_DATABASE = "edge"
POSTGRES_ROLE = "edge"


class ServiceUnavailable(RuntimeError):
    """The server's binaries are not on this machine; the message says what to install."""


def redis_binary() -> Path:
    found = shutil.which("redis-server")
    if found is None:
        raise ServiceUnavailable("no redis-server on this machine (apt-get install redis-server)")
    return Path(found)


def postgres_bin_dir() -> Path:
    """Debian's PostgreSQL binaries (`/usr/lib/postgresql/<major>/bin`), the newest major."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda path: int(Path(path).parts[-3]) if Path(path).parts[-3].isdigit() else 0,
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("postgres")
    if found is not None:
        return Path(found).resolve().parent
    raise ServiceUnavailable("no PostgreSQL server on this machine (apt-get install postgresql)")


def _answers(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((host, port)) == 0


def _stop_group(process: subprocess.Popen[bytes], first: signal.Signals) -> None:
    """`first` to the process group, SIGKILL what is left after the grace time."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, first)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=STOP_GRACE_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


class _ServerProcess:
    """What both servers do with their process: it leads a process group of its own, so a kill
    or a stop reaches everything it started and nothing else."""

    root: Path
    process: subprocess.Popen[bytes] | None
    log_name: ClassVar[str]
    # The signal of a clean stop: PostgreSQL's fast shutdown is SIGINT (open transactions rolled
    # back, then exit); Redis's is SIGTERM.
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM

    def _launch(self) -> None:
        raise NotImplementedError

    def log_tail(self, chars: int = 2000) -> str:
        log = self.root / self.log_name
        return log.read_text(errors="replace")[-chars:] if log.exists() else ""

    def kill(self) -> None:
        """A crash: the whole group SIGKILLed, no shutdown save (PostgreSQL recovers from its WAL
        on the next start, Redis from its append-only file)."""
        if self.process is not None:
            _stop_group(self.process, signal.SIGKILL)
            self.process = None

    def restart(self) -> None:
        self.stop()
        self._launch()

    def stop(self) -> None:
        if self.process is not None:
            _stop_group(self.process, self.stop_signal)
            self.process = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class RedisServer(_ServerProcess):
    """`redis-server` with a password, append-only persistence in its own dir (GCS fault
    tolerance needs what it wrote to survive a restart of Redis), on one address of this machine:
    127.0.0.1, or the bridge of an edgectl.netns network for Ray nodes in namespaces."""

    root: Path
    port: int
    password: str
    process: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"
    log_name: ClassVar[str] = "redis.log"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    @classmethod
    def start(cls, root: Path | None = None, host: str = "127.0.0.1") -> RedisServer:
        root = root or Path(tempfile.mkdtemp(prefix="edge-redis-"))
        server = cls(root, free_port(), secrets.token_hex(16), host=host)
        server._launch()
        return server

    def _launch(self) -> None:
        config = self.root / "redis.conf"
        config.write_text(
            "\n".join(
                [
                    f"bind {self.host}",
                    f"port {self.port}",
                    f"dir {self.root}",
                    f"requirepass {self.password}",
                    "appendonly yes",
                    "appendfsync everysec",
                    "save ''",
                    "daemonize no",
                    f"logfile {self.root / 'redis.log'}",
                    "",
                ]
            )
        )
        config.chmod(0o600)
        self.process = subprocess.Popen(
            [str(redis_binary()), str(config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        process = self.process
        wait_until(
            lambda: process.poll() is not None or _answers(self.port, self.host),
            START_TIMEOUT_S,
            f"redis-server on port {self.port}",
            every_s=0.1,
        )
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited:\n{self.log_tail()}")


@dataclass
class PostgresServer(_ServerProcess):
    """A PostgreSQL cluster of its own (`initdb` in a temp dir, the `postgres` server process
    itself in our process group), with a role and database `edge`, password-authenticated over
    TCP on 127.0.0.1 only. Durability settings are left at PostgreSQL's defaults: tests kill it."""

    root: Path
    port: int
    password: str
    bin_dir: Path
    os_user: str | None = None  # who runs it: `postgres` when we are root
    process: subprocess.Popen[bytes] | None = None
    log_name: ClassVar[str] = "postgres.log"
    stop_signal: ClassVar[signal.Signals] = signal.SIGINT

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def dsn(self) -> str:
        return self.dsn_of(POSTGRES_DATABASE)

    @classmethod
    def start(cls, root: Path | None = None) -> PostgresServer:
        bin_dir = postgres_bin_dir()
        root = root or Path(tempfile.mkdtemp(prefix="edge-postgres-"))
        os_user = POSTGRES_OS_USER if os.geteuid() == 0 else None
        server = cls(root, free_port(), secrets.token_hex(16), bin_dir, os_user)
        server._initdb()
        server._launch()
        return server

    def _run_kwargs(self) -> dict[str, object]:
        return {"user": self.os_user} if self.os_user else {}

    def _initdb(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        password_file = self.root / "pwfile"
        password_file.write_text(self.password + "\n")
        if self.os_user:
            owner = pwd.getpwnam(self.os_user)
            for path in (self.root, password_file):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        password_file.chmod(0o600)
        done = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                POSTGRES_ROLE,
                "--pwfile",
                str(password_file),
                "--auth",
                "scram-sha-256",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            **self._run_kwargs(),  # type: ignore[call-overload]
        )
        password_file.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed ({done.returncode}):\n{done.stderr[-2000:]}")

    def _launch(self) -> None:
        socket_dir = self.root / "socket"
        socket_dir.mkdir(exist_ok=True)
        if self.os_user:
            owner = pwd.getpwnam(self.os_user)
            os.chown(socket_dir, owner.pw_uid, owner.pw_gid)
        log = (self.root / "postgres.log").open("ab")
        self.process = subprocess.Popen(
            [
                str(self.bin_dir / "postgres"),
                "-D",
                str(self.data_dir),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={socket_dir}",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **self._run_kwargs(),  # type: ignore[call-overload]
        )
        log.close()
        process = self.process
        ready = self.bin_dir / "pg_isready"
        wait_until(
            lambda: (
                process.poll() is not None
                or subprocess.run(
                    [str(ready), "-q", "-h", "127.0.0.1", "-p", str(self.port)], timeout=10
                ).returncode
                == 0
            ),
            START_TIMEOUT_S,
            f"PostgreSQL on port {self.port}",
            every_s=0.2,
        )
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited:\n{self.log_tail()}")
        # initdb made the role; the database of the same name is made once, on the first start.
        if not (self.root / ".database-created").exists():
            self.create_database(POSTGRES_DATABASE)
            (self.root / ".database-created").touch()

    def dsn_of(self, database: str) -> str:
        return f"postgresql://{POSTGRES_ROLE}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new, empty database owned by `edge`; its DSN."""
        done = subprocess.run(
            [
                str(self.bin_dir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                POSTGRES_ROLE,
                name,
            ],
            env={**os.environ, "PGPASSWORD": self.password},
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"createdb failed ({done.returncode}):\n{done.stderr[-2000:]}")
        return self.dsn_of(name)
