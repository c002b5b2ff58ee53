"""The usage ledger and request log (table `request_log`): a batch of records written in one
transaction together with the spend they settle, read back filtered and paged, totalled by key,
model and day, and pruned past its retention."""

from __future__ import annotations

import operator
import re
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

from deployments.ingress.state.database import Database, Dialect, Row
from deployments.ingress.state.spend import SETTLE_SQL

MAX_PAGE_ROWS = 1000
STATUS_CLASS = re.compile(r"[1-5]xx")


@dataclass(frozen=True)
class RequestRecord:
    """One model request as the ledger keeps it. `budget_period` and `reserved_cost_units` are
    not columns: they settle the key's spend (key_spend) in the same transaction."""

    ts: float  # wall-clock seconds when it ended
    day: str  # its UTC day, YYYY-MM-DD: what usage is totalled by
    request_id: str | None
    key_id: str | None
    endpoint: str
    model: str | None
    region: str | None
    colo: str | None
    route_reason: str | None
    status: int
    stream: bool
    input_tokens: int
    output_tokens: int
    cost_units: float
    latency_ms: float
    ttft_ms: float | None
    cold_start_ms: float | None
    cache: str | None
    error_type: str | None
    payload: str | None = None  # the request as JSON, only where the key or request opted in
    budget_period: str | None = None  # the key's budget period it counts in; None: no budget
    reserved_cost_units: float = 0.0  # what its admission reserved, released now


LOG_COLUMNS = tuple(
    f.name for f in fields(RequestRecord) if f.name not in ("budget_period", "reserved_cost_units")
)
_INSERT = (
    f"INSERT INTO request_log ({', '.join(LOG_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in LOG_COLUMNS)})"
)
# Whether the table is there at all: a reader of someone's database never migrates it.
_TABLE_EXISTS: Mapping[Dialect, str] = {
    "sqlite": "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'request_log'",
    "postgres": "SELECT 1 WHERE to_regclass('request_log') IS NOT NULL",
}
SCAN_BATCH_ROWS = 10_000


@dataclass(frozen=True)
class LogFilter:
    key_id: str | None = None
    model: str | None = None
    status: str | None = None  # "429", or a class: "4xx"
    since_s: float | None = None  # wall-clock seconds, inclusive
    until_s: float | None = None  # exclusive

    def where(self) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        args: list[Any] = []
        for column, value in (("key_id", self.key_id), ("model", self.model)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        if self.status is not None:
            if STATUS_CLASS.fullmatch(self.status):
                low = int(self.status[0]) * 100
                clauses.append("status >= ? AND status < ?")
                args += [low, low + 100]
            else:
                clauses.append("status = ?")
                args.append(int(self.status))
        if self.since_s is not None:
            clauses.append("ts >= ?")
            args.append(self.since_s)
        if self.until_s is not None:
            clauses.append("ts < ?")
            args.append(self.until_s)
        return (" AND ".join(clauses) or "1 = 1"), args


def valid_status_filter(status: str) -> bool:
    return bool(STATUS_CLASS.fullmatch(status)) or (status.isdigit() and 100 <= int(status) < 600)


@dataclass(frozen=True)
class LogPage:
    rows: list[dict[str, Any]]
    next_cursor: int | None  # pass as `before_id` for the next (older) page


@dataclass(frozen=True)
class UsageRow:
    day: str
    key_id: str | None
    model: str | None
    requests: int
    input_tokens: int
    output_tokens: int
    cost_units: float


class RequestLog:
    def __init__(self, database: Database):
        self._db = database

    async def write(self, records: Sequence[RequestRecord]) -> None:
        """One transaction: the rows, and the spend of the keys with a budget settled."""
        rows = [_log_row(record) for record in records]
        settlements = settlement_rows(records)
        async with self._db.transaction() as tx:
            await tx.execute_many(_INSERT, rows)
            if settlements:
                await tx.execute_many(SETTLE_SQL, settlements)

    async def page(self, where: LogFilter, limit: int, before_id: int | None = None) -> LogPage:
        """The newest rows first; `before_id` continues after the last page's oldest row."""
        condition, args = where.where()
        if before_id is not None:
            condition += " AND id < ?"
            args.append(before_id)
        limit = max(1, min(limit, MAX_PAGE_ROWS))
        found = await self._db.fetch(
            f"SELECT id, {', '.join(LOG_COLUMNS)} FROM request_log WHERE {condition} "
            f"ORDER BY id DESC LIMIT {limit + 1}",
            args,
        )
        names = ("id", *LOG_COLUMNS)
        rows = [dict(zip(names, row, strict=True)) for row in found[:limit]]
        for row in rows:
            row["stream"] = bool(row["stream"])
        return LogPage(rows, rows[-1]["id"] if len(found) > limit else None)

    async def usage(self, where: LogFilter) -> list[UsageRow]:
        """Totals by day, key and model (newest day first)."""
        condition, args = where.where()
        found = await self._db.fetch(
            "SELECT day, key_id, model, COUNT(*), SUM(input_tokens), SUM(output_tokens), "
            f"SUM(cost_units) FROM request_log WHERE {condition} "
            "GROUP BY day, key_id, model ORDER BY day DESC, key_id, model",
            args,
        )
        return [
            UsageRow(day, key, model, int(n), int(tin or 0), int(tout or 0), float(cost or 0))
            for day, key, model, n, tin, tout, cost in found
        ]

    async def present(self) -> bool:
        """Whether this database has the table (a file of something else, or one no router has
        migrated yet, has not)."""
        return bool(await self._db.fetch(_TABLE_EXISTS[self._db.dialect]))

    async def scan(
        self, where: LogFilter, columns: Sequence[str], batch_rows: int = SCAN_BATCH_ROWS
    ) -> AsyncIterator[Row]:
        """Every matching row's `columns`, oldest first (by id), `batch_rows` a query: for a
        reader of the whole log (the planner's replay), without the payloads `page` returns."""
        unknown = sorted(set(columns) - set(LOG_COLUMNS))
        if unknown:
            raise ValueError(f"request_log has no columns {unknown}")
        condition, args = where.where()
        after_id = 0  # both dialects number rows from 1
        while True:
            found = await self._db.fetch(
                f"SELECT id, {', '.join(columns)} FROM request_log WHERE {condition} AND id > ? "
                f"ORDER BY id LIMIT {int(batch_rows)}",
                [*args, after_id],
            )
            for row in found:
                yield row[1:]
            if len(found) < batch_rows:
                return
            after_id = found[-1][0]

    async def prune(self, older_than_s: float) -> int:
        """Delete rows that ended before `older_than_s`; how many."""
        return await self._db.execute("DELETE FROM request_log WHERE ts < ?", (older_than_s,))


_COLUMN_VALUES = operator.attrgetter(*LOG_COLUMNS)
_STREAM = LOG_COLUMNS.index("stream")


def _log_row(record: RequestRecord) -> tuple[Any, ...]:
    """The record's columns; `stream` as 0/1, which both dialects store in an INTEGER (one
    attrgetter: every request's record passes here)."""
    row = list(_COLUMN_VALUES(record))
    row[_STREAM] = int(row[_STREAM])
    return tuple(row)


def usage_dict(row: UsageRow) -> dict[str, Any]:
    return asdict(row)


def settlement_rows(records: Iterable[RequestRecord]) -> list[tuple[Any, ...]]:
    """spend.SETTLE_SQL's rows for the records of keys with a budget, one per key and period."""
    totals: dict[tuple[str, str], list[float]] = {}
    for record in records:
        if record.budget_period is None or record.key_id is None:
            continue
        total = totals.setdefault((record.key_id, record.budget_period), [0.0, 0.0])
        total[0] += record.cost_units
        total[1] -= record.reserved_cost_units
    return [(key, period, spent, reserved) for (key, period), (spent, reserved) in totals.items()]
