"""The shared backend: PostgreSQL through `asyncpg`, a small pool per router replica.

asyncpg rather than psycopg or SQLAlchemy: the router is asyncio end to end and asyncpg is the
fastest asyncio driver, binary protocol and prepared statements included, with no ORM between
us and the handful of statements the access layer writes. The pool is made on first use and
holds no idle connection it cannot lose (`min_size=0`), so a router starts, and serves, while
the database is down; every failure to reach it is one `StoreUnavailable`."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import asyncpg

from deployments.ingress.state.database import Dialect, Row, Statements, StoreUnavailable

POOL_MAX_CONNECTIONS = 4
_PLACEHOLDER = re.compile(r"\?")
# What "the database did not answer" looks like from asyncpg: refused or lost connections,
# shutdowns, cancelled (timed-out) statements, and a connection left mid-operation by a lost
# server (InternalClientError: "another operation is in progress"), seen when it is killed.
_UNAVAILABLE = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
    asyncpg.exceptions.OperatorInterventionError,
)


def numbered_placeholders(sql: str) -> str:
    """`?` (the access layer's, SQLite's) -> `$1, $2, ...` (PostgreSQL's)."""
    counter = iter(range(1, 1 << 30))
    return _PLACEHOLDER.sub(lambda _: f"${next(counter)}", sql)


def _rowcount(status: str) -> int:
    """asyncpg's command status ("UPDATE 3", "INSERT 0 1") -> rows changed."""
    last = status.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0


class _Connection:
    def __init__(self, connection: asyncpg.Connection, timeout_s: float):
        self._connection = connection
        self._timeout_s = timeout_s

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        status = await self._connection.execute(
            numbered_placeholders(sql), *args, timeout=self._timeout_s
        )
        return _rowcount(status)

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._connection.executemany(
            numbered_placeholders(sql), [tuple(r) for r in rows], timeout=self._timeout_s
        )

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        records = await self._connection.fetch(
            numbered_placeholders(sql), *args, timeout=self._timeout_s
        )
        return [tuple(record) for record in records]


class PostgresDatabase:
    dialect: Dialect = "postgres"

    def __init__(self, dsn: str, connect_timeout_s: float = 5.0, statement_timeout_s: float = 5.0):
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s
        self._statement_timeout_s = statement_timeout_s
        self._pool: asyncpg.Pool | None = None
        self._pool_lock = asyncio.Lock()

    async def _get_pool(self) -> asyncpg.Pool:
        async with self._pool_lock:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    self._dsn,
                    min_size=0,
                    max_size=POOL_MAX_CONNECTIONS,
                    timeout=self._connect_timeout_s,
                    command_timeout=self._statement_timeout_s,
                )
            return self._pool

    @asynccontextmanager
    async def _connection(self, transaction: bool) -> AsyncIterator[Statements]:
        try:
            pool = await self._get_pool()
            async with pool.acquire(timeout=self._connect_timeout_s) as connection:
                statements = _Connection(connection, self._statement_timeout_s)
                if not transaction:
                    yield statements
                    return
                async with connection.transaction():
                    yield statements
        except _UNAVAILABLE as error:
            if self._pool is not None:
                # No connection of before the failure is used again: one the server dropped
                # can be left mid-operation, or inside a transaction that was never ended.
                await self._pool.expire_connections()
            raise StoreUnavailable(f"PostgreSQL: {type(error).__name__}: {error}") from error

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        async with self._connection(transaction=False) as statements:
            return await statements.execute(sql, args)

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        async with self._connection(transaction=True) as statements:
            await statements.execute_many(sql, rows)

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        async with self._connection(transaction=False) as statements:
            return await statements.fetch(sql, args)

    def transaction(self) -> Any:
        return self._connection(transaction=True)

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), self._connect_timeout_s)
            except (TimeoutError, *_UNAVAILABLE):
                pool.terminate()  # a database that is gone cannot say goodbye
