"""The security suite's budget leases through a database outage, in process (no Ray): router
replicas' gateway state (as shipped: budget leases) on one database, keys with budgets under
load, and the database gone for a while. One loop for both stores the gateway ships with; what
differs is only how each store's database is opened and how its outage is made:

- `sqlite`: one SQLite file, locked by another writer (`BEGIN IMMEDIATE`) for the outage;
- `postgres`: a PostgreSQL server of the run's own (edgectl.local_services), SIGKILLed for the
  outage and restarted after it (the same data dir and port: it recovers from its WAL).

Per key: the leases out when the outage began, what was admitted meanwhile, refusals while a
lease still held the request (goal 0) and the overspend once settled (goal <= leases out); the
seconds from the database's return until every record is written (goal <= RECONCILE_GOAL_S)."""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
)
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from benchmarks.lib.goals import GoalRecord, goal
from deployments.config.security import KeyBudget
from deployments.config.state import StateConfig
from deployments.errors import BudgetExceededError, BudgetUnverifiableError
from deployments.ingress.security import Principal, RateLimits, SecurityConfig
from deployments.ingress.state.budgets import SpendAdmission
from deployments.ingress.state.database import Database
from deployments.ingress.state.gateway import GatewayState
from deployments.ingress.state.leases import BudgetLeases
from deployments.ingress.state.postgres import PostgresDatabase
from deployments.ingress.state.request_log import RequestRecord
from deployments.ingress.state.spend import KeySpend, period_of
from deployments.ingress.state.sqlite import SqliteDatabase
from deployments.observability import ModelPrice
from edgectl.local_services import PostgresServer

LeaseStore = Literal["sqlite", "postgres"]
LEASE_STORES: tuple[LeaseStore, ...] = ("sqlite", "postgres")

LEASE_BUDGET = 100.0  # cost units per key; every request costs 1 (its estimate too)
LEASE_PACE_S = 0.005  # between rounds of one request per key per router
RECONCILE_GOAL_S = 10.0
# A locked SQLite answers "busy" after this: short, so a request past its lease is refused at
# once rather than holding the loop (and every other key's requests) for the shipped 5 s.
SQLITE_BUSY_TIMEOUT_S = 0.05
# PostgreSQL with the shipped timeouts: a killed server refuses connections at once anyway.
SHIPPED_STATE = StateConfig()
# The goals' names per store; SQLite's carry no store name because they were named before
# PostgreSQL was measured, and recorded reports are compared by name.
GOAL_PREFIX: dict[LeaseStore, str] = {
    "sqlite": "budget_lease_",
    "postgres": "budget_lease_postgres_",
}


@dataclass(frozen=True)
class OutageStore:
    """Where the routers' state lives: `open_database` gives each router (and the count after)
    a database of its own on the one store; `outage()` is the outage itself: entered, the
    database stops answering; left, it answers again."""

    open_database: Callable[[], Database]
    outage: Callable[[], AbstractAsyncContextManager[None]]


@asynccontextmanager
async def _sqlite_locked(path: Path) -> AsyncIterator[None]:
    """Another writer holds SQLite's write lock."""
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


@contextmanager
def _sqlite_store() -> Iterator[OutageStore]:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "gateway.sqlite3"
        yield OutageStore(
            open_database=lambda: SqliteDatabase(path, SQLITE_BUSY_TIMEOUT_S),
            outage=lambda: _sqlite_locked(path),
        )


@asynccontextmanager
async def _postgres_killed(server: PostgresServer) -> AsyncIterator[None]:
    """The server SIGKILLed (no goodbye to its clients), then restarted: left once it answers."""
    await asyncio.to_thread(server.kill)
    try:
        yield
    finally:
        await asyncio.to_thread(server.restart)


@contextmanager
def _postgres_store() -> Iterator[OutageStore]:
    # No PostgreSQL binaries raises ServiceUnavailable: the run fails, it never skips this store.
    server = PostgresServer.start()
    try:
        yield OutageStore(
            open_database=lambda: PostgresDatabase(
                server.dsn, SHIPPED_STATE.connect_timeout_s, SHIPPED_STATE.statement_timeout_s
            ),
            outage=lambda: _postgres_killed(server),
        )
    finally:
        server.remove()


STORE_SETUP: dict[LeaseStore, Callable[[], AbstractContextManager[OutageStore]]] = {
    "sqlite": _sqlite_store,
    "postgres": _postgres_store,
}


def budget_lease_outage(
    keys: int, routers: int, outage_s: float, *, store: LeaseStore
) -> dict[str, Any]:
    """`routers` routers' gateway state on one `store` database, `keys` keys of budget
    LEASE_BUDGET, a request per key and router every LEASE_PACE_S; the database away for
    `outage_s` (the module's docstring says how, and what is measured)."""
    with STORE_SETUP[store]() as database:
        return {"store": store, **asyncio.run(_lease_outage(keys, routers, outage_s, database))}


def _record(key_id: str, admission: SpendAdmission, now: float) -> RequestRecord:
    return RequestRecord(
        ts=now, day="", request_id=None, key_id=key_id, endpoint="/v1/chat/completions",
        model="bench", region=None, colo=None, route_reason=None, status=200, stream=False,
        input_tokens=1, output_tokens=1, cost_units=admission.reserved_cost_units,
        latency_ms=1.0, ttft_ms=None, cold_start_ms=None, cache=None, error_type=None,
        budget_period=admission.period, reserved_cost_units=admission.reserved_cost_units,
    )  # fmt: skip


def _leases(state: GatewayState) -> BudgetLeases:
    assert state.budgets.leases is not None, "budget leases are the shipped default"
    return state.budgets.leases


async def _lease_outage(
    keys: int, routers: int, outage_s: float, store: OutageStore
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    principals = [
        Principal(f"key-{n}", RateLimits(), budget=KeyBudget(cost_units=LEASE_BUDGET))
        for n in range(keys)
    ]
    period = period_of("month", time.time())[0]
    admitted: Counter[str] = Counter()
    refused_in_lease: Counter[str] = Counter()

    async def serve(state: GatewayState, principal: Principal, outage: bool) -> None:
        held = _leases(state).lease_of(principal.key_id, period)
        try:
            admission = await state.budgets.admit(principal, "bench", 1, 1)
        except BudgetUnverifiableError:
            refused_in_lease[principal.key_id] += held >= 1
            return
        except BudgetExceededError:
            return
        admitted[principal.key_id] += outage
        state.writer.offer(_record(principal.key_id, admission, time.time()))

    prices = {"bench": ModelPrice(per_request=1.0)}
    states = [
        GatewayState.build(StateConfig(), store.open_database(), SecurityConfig(), prices)
        for _ in range(routers)
    ]
    for state in states:
        assert await state.ensure_ready()
        state.start()
    for state in states:  # the keys are active: each router holds a lease of each
        for principal in principals:
            await serve(state, principal, outage=False)
        await _leases(state).top_ups_done()
    leases_out = {
        p.key_id: sum(_leases(s).lease_of(p.key_id, period) for s in states) for p in principals
    }
    async with store.outage():
        ends = loop.time() + outage_s
        while loop.time() < ends:
            for state in states:
                for principal in principals:
                    await serve(state, principal, outage=True)
            await asyncio.sleep(LEASE_PACE_S)
        outage_ends = loop.time()
    returned = loop.time()
    while any(s.writer.held or _leases(s).unsettled for s in states):
        await asyncio.sleep(0.01)
    reconcile_s = loop.time() - returned
    spend = await KeySpend(states[0].database).of_period({p.key_id: period for p in principals})
    for state in states:
        await state.close()  # the leases go back
    after = await _reserved_after(store.open_database(), principals, period)
    per_key = {
        key: {
            "leases_out": round(leases_out[key], 6),
            "admitted_during_outage": admitted[key],
            "refused_while_lease_held": refused_in_lease[key],
            "spent": spend[key].spent,
            "overspend": max(0.0, spend[key].spent - LEASE_BUDGET),
            "reserved_after_stop": round(after[key], 9) + 0.0,  # never -0.0
        }
        for key in leases_out
    }
    return {
        "keys": keys,
        "routers": routers,
        "outage_s": outage_s,
        # The database's own way back (a PostgreSQL restart's WAL recovery; ~0 for SQLite's
        # lock), before the reconcile time starts.
        "return_s": round(returned - outage_ends, 3),
        "budget_per_key": LEASE_BUDGET,
        "per_key": per_key,
        "refused_while_lease_held": sum(refused_in_lease.values()),
        "max_admitted_beyond_leases_out": round(
            max(v["admitted_during_outage"] - v["leases_out"] for v in per_key.values()), 6
        ),
        "max_overspend_beyond_leases_out": round(
            max(v["overspend"] - v["leases_out"] for v in per_key.values()), 6
        ),
        "reconcile_s": round(reconcile_s, 3),
    }


async def _reserved_after(
    database: Database, principals: list[Principal], period: str
) -> dict[str, float]:
    """What stays reserved once every router stopped: their leases went back, so 0."""
    try:
        found = await KeySpend(database).of_period({p.key_id: period for p in principals})
    finally:
        await database.close()
    return {key: spend.reserved for key, spend in found.items()}


def lease_goals(outage: dict[str, Any], store: LeaseStore) -> dict[str, GoalRecord]:
    """The issue's goals for budget leases through one store's outage."""
    prefix = GOAL_PREFIX[store]
    return {
        f"{prefix}refused_within_leases": goal(
            outage.get("refused_while_lease_held"), 0, "requests", at_most=True
        ),
        f"{prefix}admitted_beyond_leases_out": goal(
            outage.get("max_admitted_beyond_leases_out"), 0, "cost units (worst key)", at_most=True
        ),
        f"{prefix}overspend_beyond_leases_out": goal(
            outage.get("max_overspend_beyond_leases_out"), 0, "cost units (worst key)", at_most=True
        ),
        f"{prefix}reconcile_s": goal(
            outage.get("reconcile_s"), RECONCILE_GOAL_S, "s after the database's return",
            at_most=True,
        ),
    }  # fmt: skip
