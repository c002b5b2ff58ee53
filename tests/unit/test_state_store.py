"""The gateway's store on both backends, the same tests each: SQLite in a temp file, and a real
PostgreSQL (a database of its own on the session's server). Migrations, the request log and
usage, virtual keys, and budgets reserved by several routers at once against one database."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from ledger_records import NOW, record

from deployments.config.security import KeyBudget
from deployments.config.state import StateConfig
from deployments.errors import BudgetExceededError
from deployments.ingress.security import Principal, RateLimits, SecurityConfig
from deployments.ingress.security.keys import key_digest
from deployments.ingress.state.batch_jobs import BatchItem, BatchJobs
from deployments.ingress.state.budgets import BudgetGuard, SpendAdmission
from deployments.ingress.state.database import Database, StoreUnavailable
from deployments.ingress.state.gateway import GatewayState
from deployments.ingress.state.key_follower import KeyFollower
from deployments.ingress.state.migrations import MIGRATIONS, Migration, migrate
from deployments.ingress.state.postgres import PostgresDatabase, numbered_placeholders
from deployments.ingress.state.request_log import LogFilter, RequestLog
from deployments.ingress.state.spend import KeySpend, PeriodSpend, period_of
from deployments.ingress.state.sqlite import SqliteDatabase
from deployments.ingress.state.virtual_keys import NewKey, VirtualKeys
from deployments.observability import ModelPrice
from tests.waiting import until

T = TypeVar("T")
DAY_S = 86_400.0


@pytest.fixture(params=["sqlite", "postgres"])
def open_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Database]]:
    """Opens a database on the backend (several may be open at once: several routers)."""
    if request.param == "sqlite":
        path = tmp_path / "state.sqlite3"
        yield lambda: SqliteDatabase(path)
    else:
        dsn = request.getfixturevalue("postgres_database")
        yield lambda: PostgresDatabase(dsn)


def run(open_db: Callable[[], Database], scenario: Callable[[Database], Awaitable[T]]) -> T:
    async def main() -> T:
        database = open_db()
        try:
            await migrate(database, NOW)
            return await scenario(database)
        finally:
            await database.close()

    return asyncio.run(main())


def test_migrations_apply_once_in_order_and_are_recorded(open_db: Callable[[], Database]):
    async def scenario(db: Database) -> None:
        assert await migrate(db, NOW) == []  # run() applied them: nothing left
        rows = await db.fetch("SELECT version, name FROM schema_migrations ORDER BY version")
        assert [r[0] for r in rows] == [m.version for m in MIGRATIONS]
        extra = Migration(99, "a later concern", ("CREATE TABLE later (id TEXT)",))
        assert await migrate(db, NOW, [*MIGRATIONS, extra]) == [99]
        assert await migrate(db, NOW, [*MIGRATIONS, extra]) == []
        assert await db.fetch("SELECT COUNT(*) FROM later") == [(0,)]

    run(open_db, scenario)


def test_two_routers_migrating_at_once_apply_each_migration_once(
    open_db: Callable[[], Database],
):
    async def main() -> list[list[int]]:
        first, second = open_db(), open_db()
        try:
            return list(await asyncio.gather(migrate(first, NOW), migrate(second, NOW)))
        finally:
            await first.close()
            await second.close()

    applied = asyncio.run(main())
    versions = [m.version for m in MIGRATIONS]
    assert sorted(applied, key=len) == [[], versions]


def test_a_failed_migration_leaves_nothing_half_done(open_db: Callable[[], Database]):
    broken = Migration(50, "broken", ("CREATE TABLE half (id TEXT)", "NOT SQL AT ALL"))

    async def scenario(db: Database) -> None:
        with pytest.raises(Exception):  # noqa: B017 - each driver's own syntax error
            await migrate(db, NOW, [*MIGRATIONS, broken])
        assert await migrate(db, NOW) == []
        versions = await db.fetch("SELECT version FROM schema_migrations")
        assert 50 not in {row[0] for row in versions}
        with pytest.raises(Exception):  # noqa: B017 - the table was rolled back
            await db.fetch("SELECT * FROM half")

    run(open_db, scenario)


def test_request_log_pages_filters_and_totals(open_db: Callable[[], Database]):
    async def scenario(db: Database) -> None:
        log = RequestLog(db)
        records = [
            record(request_id=f"r{i}", ts=NOW + i, key_id="a" if i % 2 else "b", status=200)
            for i in range(7)
        ] + [
            record(
                request_id="limited",
                ts=NOW + 8,
                key_id="b",
                status=429,
                cost_units=0.0,
                stream=False,
            ),
            record(
                request_id="tomorrow",
                ts=NOW + DAY_S,
                day="2025-12-03",
                key_id="a",
                model="embedding",
            ),
        ]
        await log.write(records)

        first = await log.page(LogFilter(), limit=4)
        assert [r["request_id"] for r in first.rows] == ["tomorrow", "limited", "r6", "r5"]
        assert first.rows[1]["stream"] is False and first.rows[0]["stream"] is True
        second = await log.page(LogFilter(), limit=4, before_id=first.next_cursor)
        third = await log.page(LogFilter(), limit=4, before_id=second.next_cursor)
        seen = [r["request_id"] for page in (first, second, third) for r in page.rows]
        assert sorted(seen) == sorted(r.request_id for r in records if r.request_id)
        assert third.next_cursor is None

        assert {r["request_id"] for r in (await log.page(LogFilter(status="4xx"), 10)).rows} == {
            "limited"
        }
        by_key = await log.page(LogFilter(key_id="a", until_s=NOW + 5), 10)
        assert [r["request_id"] for r in by_key.rows] == ["r3", "r1"]
        assert [r["request_id"] for r in (await log.page(LogFilter(model="embedding"), 10)).rows]
        assert (await log.page(LogFilter(since_s=NOW + 8), 10)).rows[-1]["request_id"] == "limited"

        usage = await log.usage(LogFilter())
        totals = {(u.day, u.key_id, u.model): u for u in usage}
        assert totals[("2025-12-02", "a", "glm")].requests == 3
        assert totals[("2025-12-02", "b", "glm")].requests == 5  # 4 + the 429
        assert totals[("2025-12-02", "b", "glm")].cost_units == pytest.approx(2.0)
        assert totals[("2025-12-03", "a", "embedding")].input_tokens == 12
        assert usage[0].day == "2025-12-03"  # newest day first

        assert await log.prune(NOW + 5) == 5
        assert len((await log.page(LogFilter(), 100)).rows) == 4

    run(open_db, scenario)


def test_virtual_keys_store_only_a_digest_and_follow_a_version(open_db: Callable[[], Database]):
    async def scenario(db: Database) -> None:
        keys = VirtualKeys(db)
        start = await keys.version()
        spec = NewKey(
            name="team-a",
            models=["glm"],
            requests_per_minute=5,
            budget=KeyBudget(cost_units=10, period="day", fallback_model="kimi"),
            expires_at=NOW + DAY_S,
        )
        key, secret = await keys.create(spec, NOW)
        assert secret.startswith("sk-edge-") and key.id.startswith("vk-")
        stored = await db.fetch("SELECT * FROM api_keys")
        assert secret not in repr(stored)
        assert await keys.version() == start + 1
        assert (await keys.get(key.id)) == key
        assert key.budget == spec.budget and key.models == ("glm",)

        new_secret = await keys.rotate(key.id)
        assert new_secret is not None and new_secret != secret
        assert await keys.version() == start + 2
        assert await keys.revoke(key.id, NOW + 1)
        assert await keys.revoke(key.id, NOW + 2)  # twice: still revoked, at the first time
        assert await keys.version() == start + 3
        assert (await keys.get(key.id)).revoked_at == NOW + 1  # type: ignore[union-attr]
        assert await keys.unrevoked() == []
        assert await keys.rotate(key.id) is None
        assert not await keys.revoke("vk-nope", NOW)
        assert [k.id for k in await keys.all()] == [key.id]

    run(open_db, scenario)


def test_a_virtual_key_s_weight_is_stored_and_a_null_one_keeps_the_default(
    open_db: Callable[[], Database],
):
    async def scenario(db: Database) -> tuple[float, float]:
        keys = VirtualKeys(db)
        heavy, heavy_secret = await keys.create(NewKey(name="heavy", weight=4.0), NOW)
        _, plain_secret = await keys.create(NewKey(name="plain"), NOW)
        assert heavy.public(NOW)["weight"] == 4.0
        follower = KeyFollower(keys, SecurityConfig(default_limits=RateLimits(weight=0.5)))
        await follower.refresh()
        weights = []
        for secret in (heavy_secret, plain_secret):
            principal = follower.principal(key_digest(secret))
            assert principal is not None
            weights.append(principal.limits.weight)
        return weights[0], weights[1]

    assert run(open_db, scenario) == (4.0, 0.5)
    with pytest.raises(ValueError, match="greater than 0"):
        NewKey(name="none", weight=0)


def test_a_budget_is_reserved_atomically_and_settled_with_the_records(
    open_db: Callable[[], Database],
):
    period, _ = period_of("day", NOW)

    async def scenario(db: Database) -> dict[str, PeriodSpend]:
        spend = KeySpend(db)
        assert await spend.reserve("k", period, 4.0, budget=10.0)
        assert await spend.reserve("k", period, 6.0, budget=10.0)
        assert not await spend.reserve("k", period, 0.5, budget=10.0)  # 10 reserved
        assert not await spend.reserve("new", period, 11.0, budget=10.0)  # larger than it all
        # The first request cost 1.0 of its 4.0: the rest is released with its record.
        await RequestLog(db).write(
            [record(key_id="k", cost_units=1.0, budget_period=period, reserved_cost_units=4.0)]
        )
        assert await spend.reserve("k", period, 3.0, budget=10.0)
        return await spend.of_period({"k": period, "new": period})

    spent = run(open_db, scenario)
    assert spent == {"k": PeriodSpend(spent=1.0, reserved=9.0)}


def test_routers_reserving_together_never_admit_past_the_budget(
    open_db: Callable[[], Database],
):
    """Four routers (each its own connection to the one database) race 20 requests each for a
    budget that holds 25: exactly 25 are admitted, however they interleave."""
    period, _ = period_of("month", NOW)

    async def main() -> tuple[int, list[Any]]:
        routers = [open_db() for _ in range(4)]
        try:
            await migrate(routers[0], NOW)
            attempts = [
                KeySpend(db).reserve("shared", period, 1.0, budget=25.0)
                for db in routers
                for _ in range(20)
            ]
            admitted = sum(await asyncio.gather(*attempts))
            return admitted, await routers[0].fetch("SELECT spent, reserved FROM key_spend")
        finally:
            for db in routers:
                await db.close()

    admitted, rows = asyncio.run(main())
    assert admitted == 25
    assert rows == [(0.0, 25.0)]


def test_postgres_placeholders_are_numbered_in_order():
    assert numbered_placeholders("a = ? AND b IN (?, ?)") == "a = $1 AND b IN ($2, $3)"


def test_an_unreachable_database_is_store_unavailable(tmp_path: Path):
    async def main() -> None:
        gone = PostgresDatabase(
            "postgresql://edge:x@127.0.0.1:1/edge", connect_timeout_s=2, statement_timeout_s=2
        )
        with pytest.raises(StoreUnavailable):
            await migrate(gone, NOW)
        await gone.close()
        (tmp_path / "dir.sqlite3").mkdir()  # a folder where the file should be
        blocked = SqliteDatabase(tmp_path / "dir.sqlite3")
        with pytest.raises(StoreUnavailable):
            await migrate(blocked, NOW)
        await blocked.close()

    asyncio.run(main())


def test_sqlite_runs_in_wal_mode(tmp_path: Path):
    run(lambda: SqliteDatabase(tmp_path / "wal.sqlite3"), lambda db: asyncio.sleep(0))
    with sqlite3.connect(tmp_path / "wal.sqlite3") as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_routers_overshoot_a_budget_by_no_more_than_their_requests_in_flight(
    open_db: Callable[[], Database],
):
    """Three routers, each its own BudgetGuard and connection on the one database, serve waves
    of 4 concurrent requests per router until the budget refuses them. Every request really
    costs 1.5x its estimate, settled after the wave (its ledger records): the spend ends within
    the budget plus what the requests of one wave underestimated, the bound the docs give."""
    budget, estimate, actual, wave = 20.0, 1.0, 1.5, 4
    principal = Principal("shared", RateLimits(), budget=KeyBudget(cost_units=budget))
    prices = {"glm": ModelPrice(per_request=estimate)}

    async def main() -> tuple[float, int]:
        routers = [open_db() for _ in range(3)]
        try:
            await migrate(routers[0], NOW)
            guards = [
                BudgetGuard(
                    KeySpend(db), prices, reserve_timeout_s=30, when_store_down="refuse",
                    wall_clock=lambda: NOW,
                )
                for db in routers
            ]  # fmt: skip
            served = 0
            while True:
                tries = [g.admit(principal, "glm", 1, 1) for g in guards for _ in range(wave)]
                results = await asyncio.gather(*tries, return_exceptions=True)
                admitted = [r for r in results if isinstance(r, SpendAdmission)]
                if not admitted:
                    assert all(isinstance(r, BudgetExceededError) for r in results)
                    break
                served += len(admitted)
                await RequestLog(routers[0]).write(
                    [
                        record(
                            key_id="shared",
                            cost_units=actual,
                            budget_period=a.period,
                            reserved_cost_units=a.reserved_cost_units,
                        )
                        for a in admitted
                    ]  # fmt: skip
                )
            spend = await KeySpend(routers[0]).of_period({"shared": period_of("month", NOW)[0]})
            return spend["shared"].spent, served
        finally:
            for db in routers:
                await db.close()

    spent, served = asyncio.run(main())
    in_flight = 3 * wave
    assert spent == pytest.approx(served * actual)
    assert budget < spent <= budget + in_flight * (actual - estimate)


def test_postgres_killed_while_two_routers_write_loses_no_record(postgres_server: Any):
    """Two routers' gateway state (their own pools) offering records in rounds while the server
    is up, killed (SIGKILL) and restarted; each round waits for what the writers do with it
    (written, or a failed try while the server is down): every record offered is in the database
    afterwards, none dropped. (A connection the server dropped mid-operation was once reused and
    its batch lost.)"""
    config = StateConfig(connect_timeout_s=2, statement_timeout_s=2, ledger={"retry_max_s": 1.0})  # type: ignore[arg-type]

    async def main() -> tuple[int, int, list[int]]:
        states = [
            GatewayState.build(config, PostgresDatabase(postgres_server.dsn, 2, 2),
                               SecurityConfig(), {})
            for _ in range(2)
        ]  # fmt: skip
        for state in states:
            assert await state.ensure_ready()
            state.start()
        offered = 0

        def offer(per_router: int = 10) -> None:
            nonlocal offered
            for _ in range(per_router):
                for state in states:
                    offered += 1
                    assert state.writer.offer(record(request_id=f"r{offered}"))

        async def round_written() -> None:
            """The round's records (and any held before them) reach the database."""
            offer()
            await until(
                lambda: not any(state.writer.held for state in states),
                60,
                "the round's records written",
            )

        def failures() -> list[int]:
            return [state.writer.failed_batches for state in states]

        async def round_refused() -> None:
            """Each writer tries the dead server with the round's records, and fails."""
            before = failures()
            offer()
            await until(
                lambda: all(now > then for now, then in zip(failures(), before, strict=True)),
                60,
                "a failed write to the killed server",
            )

        for _ in range(3):
            await round_written()
        postgres_server.kill()
        for _ in range(3):
            await round_refused()
        await asyncio.to_thread(postgres_server.restart)
        for _ in range(2):
            await round_written()
        found = await states[0].database.fetch("SELECT COUNT(DISTINCT request_id) FROM request_log")
        for state in states:
            await state.close()
        return offered, int(found[0][0]), [s.writer.dropped for s in states]

    offered, in_database, dropped = asyncio.run(main())
    assert dropped == [0, 0]
    assert in_database == offered


def batch_items(count: int) -> list[BatchItem]:
    return [
        BatchItem(i, {"text": f"item {i}"}, f"ref-{i}" if i % 2 else None) for i in range(count)
    ]


def test_a_batch_job_is_claimed_by_one_router_at_a_time(open_db: Callable[[], Database]):
    """Two routers (each its own connection) claim at once, round after round: each job goes
    to exactly one of them (a claim that lost a race gets none, and the next round's takes the
    next job); a job of a model not offered (cold) is never claimed."""

    async def main() -> tuple[list[str], list[tuple[str, str]]]:
        first, second = open_db(), open_db()
        try:
            await migrate(first, NOW)
            jobs = BatchJobs(first)
            for n in range(6):
                await jobs.create(
                    f"job-{n}", "team-a", ("embedding", "embedding"), batch_items(1), NOW + n
                )
            await jobs.create("cold-job", "team-a", ("glm", "glm"), batch_items(1), NOW)
            won: list[str] = []
            for _ in range(12):
                claims = [
                    BatchJobs(db).claim(f"router-{i}", ["embedding"], NOW + 10, lease_s=30)
                    for i, db in enumerate([first, second, first, second])
                ]
                won += [job.id for job in await asyncio.gather(*claims) if job is not None]
            rows = await first.fetch(
                "SELECT id, status FROM batch_jobs WHERE status <> 'queued' ORDER BY id"
            )
            return won, rows
        finally:
            await first.close()
            await second.close()

    won, rows = asyncio.run(main())
    assert sorted(won) == [f"job-{n}" for n in range(6)]  # every job once, none twice
    assert rows == [(f"job-{n}", "running") for n in range(6)]


def test_a_dead_routers_job_is_resumed_from_its_first_unfinished_item(
    open_db: Callable[[], Database],
):
    async def scenario(db: Database) -> None:
        jobs = BatchJobs(db)
        await jobs.create("job", "team-a", ("embedding", "embedding"), batch_items(3), NOW)
        assert (await jobs.claim("router-a", ["embedding"], NOW, lease_s=30)) is not None
        assert await jobs.claim("router-b", ["embedding"], NOW + 29, lease_s=30) is None
        ok = {"result": {"shape": [1, 2]}, "success": True}
        assert await jobs.record("job", "router-a", 0, ok, (3, 0), NOW + 1, lease_s=30)
        # router-a dies; its lease (renewed at NOW + 1) ends at NOW + 31.
        assert await jobs.claim("router-b", ["embedding"], NOW + 30, lease_s=30) is None
        taken = await jobs.claim("router-b", ["embedding"], NOW + 32, lease_s=30)
        assert taken is not None and taken.lease_owner == "router-b"
        assert [item.index for item in await jobs.pending("job", 10)] == [1, 2]
        # router-a, back late, writes nothing: it no longer holds the job.
        assert not await jobs.record("job", "router-a", 1, ok, (1, 0), NOW + 33, lease_s=30)
        assert not await jobs.finish("job", "router-b", NOW + 33, NOW + 100)  # items left
        for index in (1, 2):
            assert await jobs.record("job", "router-b", index, ok, (2, 1), NOW + 34, lease_s=30)
        assert await jobs.finish("job", "router-b", NOW + 35, expires_at=NOW + 100)
        results = await jobs.results("job")
        assert [(r.index, r.response, r.external_reference) for r in results] == [
            (0, ok, None),
            (1, ok, "ref-1"),
            (2, ok, None),
        ]
        assert sum(r.prompt_tokens for r in results) == 7
        job = await jobs.get("job")
        assert job is not None and job.status == "done" and job.lease_owner is None

    run(open_db, scenario)


def test_a_released_batch_job_is_queued_again(open_db: Callable[[], Database]):
    async def scenario(db: Database) -> None:
        jobs = BatchJobs(db)
        await jobs.create("job", "team-a", ("glm", "glm"), batch_items(2), NOW)
        assert await jobs.claim("router-a", ["glm"], NOW, lease_s=30) is not None
        assert not await jobs.release("job", "router-b", NOW)  # not its job
        assert await jobs.release("job", "router-a", NOW + 1)
        job = await jobs.get("job")
        assert job is not None and (job.status, job.lease_owner) == ("queued", None)
        assert await jobs.claim("router-b", ["glm"], NOW + 2, lease_s=30) is not None

    run(open_db, scenario)


def test_expired_batch_jobs_lose_their_items_then_their_tombstone(
    open_db: Callable[[], Database],
):
    async def scenario(db: Database) -> None:
        jobs = BatchJobs(db)
        await jobs.create("job", "team-a", ("embedding", "embedding"), batch_items(2), NOW)
        await jobs.create("waiting", "team-a", ("embedding", "embedding"), batch_items(1), NOW + 1)
        assert await jobs.claim("router-a", ["embedding"], NOW, lease_s=30) is not None
        for index in (0, 1):
            await jobs.record("job", "router-a", index, {"success": True}, (1, 0), NOW, 30)
        assert await jobs.finish("job", "router-a", NOW, expires_at=NOW + 100)
        assert await jobs.prune(NOW + 99, tombstone_s=50) == 0
        job = await jobs.get("job")
        assert job is not None and not job.expired(NOW + 99) and job.expired(NOW + 100)
        assert await jobs.prune(NOW + 100, tombstone_s=50) == 1
        job = await jobs.get("job")
        assert job is not None and job.status == "expired" and await jobs.results("job") == []
        assert await jobs.prune(NOW + 150, tombstone_s=50) == 1
        assert await jobs.get("job") is None
        waiting = await jobs.get("waiting")  # a queued job has no expiry yet
        assert waiting is not None and waiting.status == "queued"
        assert len(await jobs.results("waiting")) == 1

    run(open_db, scenario)
