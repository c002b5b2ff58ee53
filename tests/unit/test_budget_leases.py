"""Budget leases on a real SQLite file: requests within a router's lease are admitted while the
database is away (locked by another writer, or failing), those beyond it refused 503, no key
admitted beyond the leases out; the records settle the spend when it is back, idle leases and
every lease at shutdown go back; slices sized as configured, topped up ahead of need."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from ledger_records import NOW, record
from pydantic import ValidationError

from deployments.config.security import KeyBudget
from deployments.config.state import BudgetLeaseConfig, StateConfig
from deployments.errors import BudgetExceededError, BudgetUnverifiableError
from deployments.ingress.security import Principal, RateLimits
from deployments.ingress.state.budgets import BudgetGuard, SpendAdmission
from deployments.ingress.state.database import Database, Row, Statements, StoreUnavailable
from deployments.ingress.state.leases import BudgetLeases, LeaseMetrics
from deployments.ingress.state.migrations import migrate
from deployments.ingress.state.request_log import RequestLog
from deployments.ingress.state.spend import KeySpend, PeriodSpend, period_of
from deployments.ingress.state.sqlite import SqliteDatabase
from deployments.observability import InMemoryMetricsBackend, ModelPrice

T = TypeVar("T")
PRICES = {"glm": ModelPrice(per_request=1.0)}  # every request's estimate (and cost): 1
PERIOD, PERIOD_ENDS = period_of("month", NOW)


@dataclass
class FlakyDatabase:
    """A database that stops answering while `down` (every statement: StoreUnavailable), as a
    PostgreSQL that was killed looks to the access layer."""

    inner: Database
    down: bool = False
    calls: int = 0
    dialect: Any = "sqlite"

    def _check(self) -> None:
        self.calls += 1
        if self.down:
            raise StoreUnavailable("the database is away")

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        self._check()
        return await self.inner.execute(sql, args)

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._check()
        await self.inner.execute_many(sql, rows)

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        self._check()
        return await self.inner.fetch(sql, args)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Statements]:
        self._check()
        async with self.inner.transaction() as statements:
            yield statements

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class Router:
    """One router replica's budgets: its own connection, leases and clock."""

    database: Database
    config: BudgetLeaseConfig = field(default_factory=BudgetLeaseConfig)
    clock: list[float] = field(default_factory=lambda: [0.0])
    wall: list[float] = field(default_factory=lambda: [NOW])
    metrics: InMemoryMetricsBackend = field(default_factory=InMemoryMetricsBackend)

    def __post_init__(self) -> None:
        self.leases = BudgetLeases(
            KeySpend(self.database),
            self.config,
            wait_s=30,
            metrics=LeaseMetrics(self.metrics),
            clock=lambda: self.clock[0],
            wall_clock=lambda: self.wall[0],
        )
        self.guard = BudgetGuard(
            KeySpend(self.database),
            PRICES,
            reserve_timeout_s=30,
            when_store_down="lease",
            leases=self.leases,
            wall_clock=lambda: self.wall[0],
        )

    async def admit(self, principal: Principal) -> SpendAdmission:
        return await self.guard.admit(principal, "glm", 1, 1)

    async def settle(self, admitted: Sequence[SpendAdmission], key_id: str) -> None:
        """The admitted requests' ledger records written, each having cost its estimate."""
        await RequestLog(self.database).write(
            [
                record(
                    key_id=key_id,
                    cost_units=a.reserved_cost_units,
                    budget_period=a.period,
                    reserved_cost_units=a.reserved_cost_units,
                )
                for a in admitted
            ]  # fmt: skip
        )
        self.leases.settled(sum(a.reserved_cost_units for a in admitted))


def key(key_id: str, budget: float) -> Principal:
    return Principal(key_id, RateLimits(), budget=KeyBudget(cost_units=budget))


def run(path: Path, scenario: Callable[[SqliteDatabase], Awaitable[T]]) -> T:
    async def main() -> T:
        database = SqliteDatabase(path, busy_timeout_s=0.05)
        try:
            await migrate(database, NOW)
            return await scenario(database)
        finally:
            await database.close()

    return asyncio.run(main())


async def spend_of(database: Database, key_id: str) -> PeriodSpend:
    return (await KeySpend(database).of_period({key_id: PERIOD})).get(key_id, PeriodSpend(0, 0))


def test_sqlite_locked_by_another_writer_spends_the_lease_then_refuses_until_it_is_back(
    tmp_path: Path,
):
    """Budget 10, slices of 30% of what remains: the first request takes a slice of 3, and
    while another process holds SQLite's write lock the two requests the lease still holds are
    served, the next refused (503, Retry-After); its release lets records settle and slices be
    reserved again."""

    async def scenario(database: SqliteDatabase) -> None:
        router = Router(database, BudgetLeaseConfig(fraction=0.3, refill_below=0.4))
        team = key("team", 10)
        admitted = [await router.admit(team)]
        assert router.leases.leased == pytest.approx(2)
        assert (await spend_of(database, "team")).reserved == pytest.approx(3)

        blocker = sqlite3.connect(database.path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")  # another writer: our writes wait, then fail
        leased_at_outage = router.leases.leased
        admitted += [await router.admit(team) for _ in range(2)]
        with pytest.raises(BudgetUnverifiableError) as refused:
            await router.admit(team)
        assert refused.value.status == 503 and refused.value.code == "budget_unverifiable"
        assert refused.value.response_headers() == {"retry-after": "1", "retry-after-ms": "1000"}
        assert len(admitted) - 1 <= leased_at_outage  # within what was leased, none beyond
        with pytest.raises(StoreUnavailable):
            await router.settle(admitted, "team")  # the records wait for the database
        assert router.leases.unsettled == pytest.approx(3)
        assert router.metrics.values("edge_state_budget_unverifiable_total") == [1]

        blocker.execute("ROLLBACK")
        blocker.close()
        await router.settle(admitted, "team")
        assert router.leases.unsettled == 0
        assert await spend_of(database, "team") == PeriodSpend(3, 0)  # settled, nothing held
        router.clock[0] += router.config.refresh_interval_s  # past the pause after a failure
        admitted.append(await router.admit(team))  # slice of 30% of the 7 left
        assert (await spend_of(database, "team")).reserved == pytest.approx(2.1)
        leased = router.metrics.values("edge_state_budget_leased_cost_units")
        assert leased[-1] == pytest.approx(2.1)

    run(tmp_path / "gateway.sqlite3", scenario)


def test_ten_keys_on_three_routers_spend_no_more_than_their_leases_while_the_database_is_down(
    tmp_path: Path,
):
    """Three routers (their own connections to one SQLite file), ten keys of budget 20: each
    router serves each key until the database goes away, then until its lease runs out. No key
    is admitted beyond the leases out when it went, none is refused while a lease holds its
    request, and once it is back the records settle every key within its budget; the routers
    stopping give every lease back."""
    keys = [key(f"key-{n}", 20) for n in range(10)]

    async def scenario(database: SqliteDatabase) -> None:
        flaky = [FlakyDatabase(SqliteDatabase(database.path)) for _ in range(3)]
        routers = [Router(db) for db in flaky]
        admitted: dict[tuple[int, str], list[SpendAdmission]] = {
            (n, k.key_id): [] for n in range(3) for k in keys
        }
        for n, router in enumerate(routers):
            for principal in keys:
                admitted[n, principal.key_id].append(await router.admit(principal))
            await router.leases.top_ups_done()
        leases_out = {
            k.key_id: sum(r.leases.lease_of(k.key_id, PERIOD) for r in routers) for k in keys
        }
        for db in flaky:
            db.down = True
        for n, router in enumerate(routers):
            for principal in keys:
                in_lease = router.leases.lease_of(principal.key_id, PERIOD)
                while True:
                    try:
                        admitted[n, principal.key_id].append(await router.admit(principal))
                    except BudgetUnverifiableError:
                        break
                assert router.leases.lease_of(principal.key_id, PERIOD) < 1  # none refused early
                assert len(admitted[n, principal.key_id]) - 1 == int(in_lease)
        for db in flaky:
            db.down = False
        for (n, key_id), requests in admitted.items():
            await routers[n].settle(requests, key_id)
        for principal in keys:
            served = sum(len(admitted[n, principal.key_id]) for n in range(3))
            spend = await spend_of(database, principal.key_id)
            assert spend.spent == served
            overspend = max(0.0, spend.spent - 20)
            assert overspend <= leases_out[principal.key_id]  # and in fact none:
            assert spend.spent + spend.reserved <= 20 + 1e-9
            print(f"{principal.key_id}: leases out {leases_out[principal.key_id]:.3f}, "
                  f"served {served}, overspend {overspend:g}")  # fmt: skip
        for router in routers:
            assert router.leases.unsettled == 0
            await router.leases.close()
        for principal in keys:
            assert (await spend_of(database, principal.key_id)).reserved == pytest.approx(0)
        for db in flaky:
            await db.close()

    run(tmp_path / "gateway.sqlite3", scenario)


def test_a_lease_is_topped_up_ahead_of_need_and_requests_within_it_never_wait(tmp_path: Path):
    async def scenario(database: SqliteDatabase) -> None:
        flaky = FlakyDatabase(database)
        router = Router(flaky, BudgetLeaseConfig(fraction=0.5, refill_below=0.5))
        team = key("team", 100)
        await router.admit(team)  # a slice of 50: 49 left
        calls = flaky.calls
        for _ in range(24):  # down to 25: half the slice, not below it
            await router.admit(team)
        assert flaky.calls == calls and router.leases.leased == 25
        await router.admit(team)  # 24 left: a top-up starts, this request does not wait for it
        assert router.leases.leased == 24
        await router.leases.top_ups_done()
        assert router.leases.leased == pytest.approx(24 + 0.5 * (100 - 50))
        assert (await spend_of(database, "team")).reserved == pytest.approx(75)

    run(tmp_path / "gateway.sqlite3", scenario)


def test_idle_leases_and_those_of_an_ended_period_go_back(tmp_path: Path):
    async def scenario(database: SqliteDatabase) -> None:
        router = Router(database, BudgetLeaseConfig(fraction=0.1, idle_s=60))
        await router.admit(key("idle", 10))
        router.clock[0] = 30
        await router.admit(key("busy", 10))
        await router.leases.top_ups_done()
        await router.leases.maintain()  # neither idle yet
        assert (await spend_of(database, "idle")).reserved == pytest.approx(1.9)
        router.clock[0] = 60
        await router.leases.maintain()
        assert (await spend_of(database, "idle")).reserved == pytest.approx(1.0)  # in flight
        assert (await spend_of(database, "busy")).reserved == pytest.approx(1.9)
        router.wall[0] = PERIOD_ENDS  # the month is over: its lease goes back
        await router.leases.maintain()
        assert (await spend_of(database, "busy")).reserved == pytest.approx(1.0)
        assert router.leases.leased == 0

    run(tmp_path / "gateway.sqlite3", scenario)


def test_a_request_the_budget_cannot_hold_is_refused_though_the_lease_is_partly_there(
    tmp_path: Path,
):
    async def scenario(database: SqliteDatabase) -> None:
        router = Router(database, BudgetLeaseConfig(fraction=1.0))
        team = key("team", 2.5)
        await router.admit(team)  # the whole 2.5 leased: 1.5 left in it
        await router.admit(team)
        with pytest.raises(BudgetExceededError):
            await router.admit(team)  # 0.5 in the lease, nothing left to add
        assert router.leases.leased == pytest.approx(0.5)

    run(tmp_path / "gateway.sqlite3", scenario)


@pytest.mark.parametrize(
    ("config", "remaining", "slice_"),
    [
        (BudgetLeaseConfig(fraction=0.1, min_cost_units=2, max_cost_units=5), 100, 5),
        (BudgetLeaseConfig(fraction=0.1, min_cost_units=2, max_cost_units=5), 10, 2),
        (BudgetLeaseConfig(fraction=0.1, min_cost_units=2, max_cost_units=5), 1.5, 1.5),
        (BudgetLeaseConfig(fraction=0.1), 30, 3),
    ],
)
def test_a_slice_is_a_fraction_of_what_remains_within_min_and_max(
    tmp_path: Path, config: BudgetLeaseConfig, remaining: float, slice_: float
):
    async def scenario(database: SqliteDatabase) -> None:
        router = Router(database, config)
        await router.admit(key("team", remaining))
        assert (await spend_of(database, "team")).reserved == pytest.approx(slice_)

    run(tmp_path / "gateway.sqlite3", scenario)


def test_the_lease_settings_are_checked():
    assert StateConfig().budget_when_store_down == "lease"
    with pytest.raises(ValidationError, match="'lease', 'admit' or 'refuse'"):
        StateConfig(budget_when_store_down="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match=r"max_cost_units \(1\) is below min_cost_units"):
        BudgetLeaseConfig(min_cost_units=2, max_cost_units=1)
    never_opened = SqliteDatabase(Path("never-opened"))
    with pytest.raises(ValueError, match="exactly when budget_when_store_down: lease"):
        BudgetGuard(KeySpend(never_opened), PRICES, reserve_timeout_s=1, when_store_down="admit",
                    leases=Router(never_opened).leases)  # fmt: skip
