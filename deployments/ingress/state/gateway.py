"""A router replica's gateway state: the database (SQLite under data_dir, or PostgreSQL), its
migrations, the tables' access objects, and the background work that keeps this replica in step
with it: writing the ledger, following the keys table, pruning old rows. Opened once per
replica; `start` never waits for the database, so a router serves while it is down."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from deployments.config.state import DATABASE_URL_ENV, POSTGRES_SCHEMES, StateConfig
from deployments.ingress.security import SecurityConfig
from deployments.ingress.state.batch_jobs import BatchJobs
from deployments.ingress.state.budgets import BudgetGuard
from deployments.ingress.state.database import Database, StoreUnavailable
from deployments.ingress.state.key_follower import KeyFollower
from deployments.ingress.state.leases import BudgetLeases, LeaseMetrics
from deployments.ingress.state.ledger import RequestLedger
from deployments.ingress.state.migrations import migrate
from deployments.ingress.state.request_log import RequestLog, RequestRecord
from deployments.ingress.state.spend import KeySpend
from deployments.ingress.state.sqlite import SqliteDatabase
from deployments.ingress.state.virtual_keys import VirtualKeys
from deployments.ingress.state.write_behind import RecordWriter, WriterMetrics
from deployments.observability import MetricsBackend, ModelPrice

SECONDS_PER_DAY = 86_400.0
SHUTDOWN_FLUSH_S = 5.0


class StateConfigError(ValueError):
    """A database URL we cannot use; the message never echoes the URL (it may hold a
    password)."""


def database_url(config: StateConfig, environ: Mapping[str, str]) -> str | None:
    """EDGE_DATABASE_URL, else state.database_url; None: the embedded SQLite file."""
    url = environ.get(DATABASE_URL_ENV, "").strip() or config.database_url
    if url and not url.startswith(POSTGRES_SCHEMES):
        raise StateConfigError(
            f"{DATABASE_URL_ENV} / state.database_url: only postgresql:// URLs are supported "
            "(leave it unset for the embedded SQLite file)"
        )
    return url or None


def open_database(
    config: StateConfig, sqlite_path: Callable[[str], Any], environ: Mapping[str, str]
) -> Database:
    """PostgreSQL when a URL is configured, else SQLite at `sqlite_path(state.sqlite_file)`."""
    url = database_url(config, environ)
    if url is None:
        return SqliteDatabase(sqlite_path(config.sqlite_file), config.statement_timeout_s)
    from deployments.ingress.state.postgres import PostgresDatabase  # asyncpg only where it is used

    return PostgresDatabase(url, config.connect_timeout_s, config.statement_timeout_s)


@dataclass
class GatewayState:
    config: StateConfig
    database: Database
    keys: VirtualKeys
    follower: KeyFollower
    spend: KeySpend
    budgets: BudgetGuard
    log_table: RequestLog
    writer: RecordWriter[RequestRecord]
    ledger: RequestLedger
    batches: BatchJobs
    wall_clock: Callable[[], float] = time.time
    clock: Callable[[], float] = time.monotonic
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("ray.serve"))
    ready: bool = False  # migrations applied (by this replica or another)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        config: StateConfig,
        database: Database,
        security: SecurityConfig,
        prices: Mapping[str, ModelPrice],
        *,
        metrics_backend: MetricsBackend | None = None,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> GatewayState:
        keys, spend, log_table = VirtualKeys(database), KeySpend(database), RequestLog(database)
        leases = None
        if config.budget_when_store_down == "lease":
            leases = BudgetLeases(
                spend,
                config.budget_leases,
                wait_s=config.budget_reserve_timeout_s,
                metrics=LeaseMetrics(metrics_backend) if metrics_backend is not None else None,
                clock=clock,
                wall_clock=wall_clock,
            )

        async def write_and_settle(records: Sequence[RequestRecord]) -> None:
            await log_table.write(records)
            if leases is not None:
                leases.settled(sum(record.reserved_cost_units for record in records))

        writer: RecordWriter[RequestRecord] = RecordWriter(
            write_and_settle,
            config.ledger,
            metrics=WriterMetrics(metrics_backend) if metrics_backend is not None else None,
            clock=clock,
        )
        return cls(
            config=config,
            database=database,
            keys=keys,
            follower=KeyFollower(keys, security, wall_clock=wall_clock),
            spend=spend,
            budgets=BudgetGuard(
                spend,
                prices,
                reserve_timeout_s=config.budget_reserve_timeout_s,
                when_store_down=config.budget_when_store_down,
                leases=leases,
                wall_clock=wall_clock,
            ),
            log_table=log_table,
            writer=writer,
            ledger=RequestLedger(writer, prices, wall_clock),
            batches=BatchJobs(database),
            wall_clock=wall_clock,
            clock=clock,
        )

    async def ensure_ready(self) -> bool:
        """Apply the migrations once; False while the database does not answer."""
        if not self.ready:
            try:
                applied = await migrate(self.database, self.wall_clock())
            except StoreUnavailable as error:
                self.log.warning("state: database not ready (%s); serving without it", error)
                return False
            if applied:
                self.log.info("state: schema migrations %s applied", applied)
            self.ready = True
            await self.follower.poll()
        return True

    def start(self) -> None:
        """The background work, on the running loop: nothing here waits for the database."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._follow_keys()),
            loop.create_task(self._write_records()),
            loop.create_task(self._prune()),
        ]
        if self.budgets.leases is not None:
            self._tasks.append(loop.create_task(self._keep_leases(self.budgets.leases)))

    async def _follow_keys(self) -> None:
        while True:
            if await self.ensure_ready():
                await self.follower.poll()
            await asyncio.sleep(self.config.keys_poll_interval_s)

    async def _write_records(self) -> None:
        while True:
            await asyncio.sleep(self.writer.retry_delay_s())
            if self.ready:
                await self.writer.flush_ready()

    async def _keep_leases(self, leases: BudgetLeases) -> None:
        while True:
            await asyncio.sleep(self.config.budget_leases.refresh_interval_s)
            if self.ready:
                await leases.maintain()

    async def _prune(self) -> None:
        retention_s = self.config.ledger.retention_days * SECONDS_PER_DAY
        while not self.ready:
            await asyncio.sleep(self.config.keys_poll_interval_s)
        while True:
            if self.ready:
                try:
                    removed = await self.log_table.prune(self.wall_clock() - retention_s)
                except StoreUnavailable as error:
                    self.log.warning("state: pruning the request log failed (%s)", error)
                else:
                    if removed:
                        self.log.info("state: %d request-log rows past retention pruned", removed)
                try:
                    changed = await self.batches.prune(
                        self.wall_clock(), self.config.batch.tombstone_s
                    )
                except StoreUnavailable as error:
                    self.log.warning("state: pruning batch jobs failed (%s)", error)
                else:
                    if changed:
                        self.log.info("state: %d batch jobs expired or pruned", changed)
            await asyncio.sleep(self.config.ledger.prune_interval_s)

    async def close(self) -> None:
        """Stop the background work, write the queued records (within SHUTDOWN_FLUSH_S), give
        the budget leases back, close."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.ready or await self.ensure_ready():
            await self.writer.close(self.clock() + SHUTDOWN_FLUSH_S)
            if self.budgets.leases is not None:
                await self.budgets.leases.close()
        await self.database.close()
