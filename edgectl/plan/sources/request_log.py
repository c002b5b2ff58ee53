"""The gateway's request log (table `request_log`, one row per model request a router finished)
as a planner trace: each request at its arrival, from its entry colo's position. Read, never
migrated, from a router's SQLite file or the shared PostgreSQL through deployments.ingress.state."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from deployments.config.state import POSTGRES_SCHEMES, StateConfig
from deployments.ingress.state.database import Database, Row, StoreUnavailable
from deployments.ingress.state.gateway import open_database
from deployments.ingress.state.request_log import LogFilter, RequestLog
from deployments.observability.outcome import CLIENT_CLOSED_REQUEST
from edge_sim.plan.replay import ReplayedRequest, replay_trace
from edgectl.plan.sources.scope import Replay, SourceScope, shown, skipped_text

SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
COLUMNS = (
    "ts", "latency_ms", "model", "colo", "region", "status", "cache",
    "input_tokens", "output_tokens", "cold_start_ms",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LoggedRequest:
    """A replayed row as the log has it, beside the trace for comparing a replay with what the
    gateway saw (tokens are kept, though the planner's service time does not grow with them).
    `arrival_s`: wall-clock unix seconds (the row's end, `ts`, less its latency)."""

    arrival_s: float
    model: str
    colo: str
    region: str | None
    status: int
    input_tokens: int
    output_tokens: int
    latency_ms: float
    cold_start_ms: float | None


def not_replayed(
    model: str | None,
    colo: str | None,
    status: int,
    cache: str | None,
    served: Collection[str],
    colos: Collection[str],
) -> str | None:
    """Why a row is not replayed (the first reason that applies), or None: it is load.

    Load is a row for a model the config serves that the router routed (it names an entry colo
    of the world) and that was neither a client error nor answered without a model call of its
    own (a colo's cache, or an identical request's answer it waited for). A 4xx is refused
    before any model (auth, limits, budgets, validation) or is the client's mistake, and the
    dispatcher never counts one against a backend either; 499 (the client left) is load, a
    model was working on it. The router records the entry colo only for requests it routed to
    an answer, so a 5xx it shed or failed has none: counted, not replayed (docs/plan.md)."""
    if 400 <= status < 500 and status != CLIENT_CLOSED_REQUEST:
        return "client error (4xx)"
    if cache == "HIT":
        return "cache hit"
    if cache == "JOINED":  # waited for an identical request's answer: no model call of its own
        return "joined an identical request"
    if model is None:
        return "no model"
    if model not in served:
        return f"model not served: {model}"
    if colo is None:
        return "no entry colo (5xx: shed or failed)" if status >= 500 else "no entry colo"
    if colo not in colos:
        return f"colo not in the topology: {colo}"
    return None


def open_log_database(location: str) -> Database:
    """The project's own database for LOCATION: a postgresql:// URL, or a SQLite file that
    must exist (opening a missing one would create an empty database)."""
    if location.startswith(POSTGRES_SCHEMES):
        config = StateConfig(database_url=location)
    elif "://" in location:
        raise ValueError(f"request-log:{shown(location)}: a SQLite file or a postgresql:// URL")
    else:
        path = Path(location)
        if not path.is_file():
            raise ValueError(f"request-log:{location}: no such file")
        with path.open("rb") as handle:
            if handle.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                raise ValueError(f"request-log:{location}: not a SQLite database")
        config = StateConfig(sqlite_file=str(path))
    # No environment: EDGE_DATABASE_URL must not replace the LOCATION given.
    return open_database(config, Path, environ={})


def _failures(database: Database) -> tuple[type[BaseException], ...]:
    """What reading may raise that is LOCATION's fault, not a bug: the database not answering,
    and PostgreSQL refusing us (a wrong password, no such database)."""
    if database.dialect == "postgres":
        import asyncpg  # only where PostgreSQL is used, as open_database imports it

        return (StoreUnavailable, asyncpg.PostgresError)
    return (StoreUnavailable,)


async def _scan(database: Database, where: LogFilter, take: Callable[[Row], None]) -> bool:
    """Each row's COLUMNS to `take`, oldest first; False: the database has no request log."""
    log = RequestLog(database)
    try:
        if not await log.present():
            return False
        async for row in log.scan(where, COLUMNS):
            take(row)
        return True
    finally:
        await database.close()


def read_request_log(location: str, scope: SourceScope) -> tuple[Replay, list[LoggedRequest]]:
    """The trace (t = 0 at the first arrival; origins: the entry colos, at their positions in
    the world's topology), what was left out and why, and the replayed rows in time order."""
    positions = {c.id: (c.lat, c.lon) for c in scope.edge.resolved_topology.colos}
    served = set(scope.models)
    skipped: Counter[str] = Counter()
    rows: list[LoggedRequest] = []

    def take(row: Row) -> None:  # classified as read: only the replayed rows are kept
        ts, latency_ms, model, colo, region, status, cache, tin, tout, cold_ms = row
        reason = not_replayed(model, colo, status, cache, served, positions)
        if reason is not None:
            skipped[reason] += 1
            return
        arrival = float(ts) - float(latency_ms) / 1000.0
        rows.append(
            LoggedRequest(arrival, model, colo, region, status, tin, tout, latency_ms, cold_ms)
        )

    database = open_log_database(location)
    where = LogFilter(since_s=scope.since_s, until_s=scope.until_s)
    try:
        has_log = asyncio.run(_scan(database, where, take))
    except _failures(database) as error:
        raise ValueError(f"request-log:{shown(location)}: {error}") from None
    if not has_log:
        raise ValueError(
            f"request-log:{shown(location)}: no request_log table (not the gateway's database, "
            "or no router has started on it)"
        )
    if not rows:
        window = " in the --since/--until window" if scope.windowed else ""
        if not skipped:
            raise ValueError(f"request-log:{shown(location)}: no requests logged{window}")
        raise ValueError(
            f"request-log:{shown(location)}: none of its {skipped.total():,} rows{window} is "
            f"replayable ({skipped_text(skipped)})"
        )
    rows.sort(key=lambda r: r.arrival_s)
    start_s = rows[0].arrival_s
    trace = replay_trace(
        (ReplayedRequest(r.arrival_s - start_s, r.model, r.colo) for r in rows),
        positions,
        source=f"request-log:{shown(location)}",
    )
    return Replay(trace, dict(skipped.most_common()), started_at_s=start_s), rows


def replay(location: str, scope: SourceScope) -> Replay:
    """The `request-log:SQLITE_FILE|postgresql://URL` source."""
    return read_request_log(location, scope)[0]
