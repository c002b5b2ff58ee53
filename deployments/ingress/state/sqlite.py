"""The embedded backend: the standard library's `sqlite3` on one thread of its own per process.

No driver to pin: `aiosqlite` is the same idea (a thread per connection, asyncio futures around
it) as a dependency. WAL lets readers run while one writer writes, and several router replicas
of one machine share the file; `busy_timeout` makes a second writer wait its turn instead of
failing. Statements of this process run one at a time (an asyncio lock), so a transaction's
statements are never interleaved with another coroutine's on the one connection."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from deployments.ingress.state.database import Dialect, Row, Statements, StoreUnavailable
from deployments.sqlite_wal import enable_wal

T = TypeVar("T")


class _Connection:
    """Statements on the open connection, run on the database's thread."""

    def __init__(self, database: SqliteDatabase):
        self._database = database

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        return await self._database._call(lambda c: c.execute(sql, tuple(args)).rowcount)

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        await self._database._call(lambda c: c.executemany(sql, [tuple(r) for r in rows]))

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        return await self._database._call(lambda c: c.execute(sql, tuple(args)).fetchall())


class SqliteDatabase:
    dialect: Dialect = "sqlite"

    def __init__(self, path: Path, busy_timeout_s: float = 5.0):
        self.path = path
        self._busy_timeout_ms = int(busy_timeout_s * 1000)
        self._thread: ThreadPoolExecutor | None = None
        self._connection: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()
        self._statements = _Connection(self)

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: autocommit, transactions only where we BEGIN them.
            connection = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            connection.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            enable_wal(connection, self._busy_timeout_ms / 1000)
            connection.execute("PRAGMA synchronous = NORMAL")  # WAL's safe setting
            self._connection = connection
        return self._connection

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-sqlite")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._thread, lambda: work(self._connect()))
        except sqlite3.OperationalError as error:  # locked past busy_timeout, disk, I/O
            raise StoreUnavailable(f"SQLite {self.path}: {error}") from error

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        async with self._lock:
            return await self._statements.execute(sql, args)

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        async with self._lock:
            await self._statements.execute_many(sql, rows)

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]:
        async with self._lock:
            return await self._statements.fetch(sql, args)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Statements]:
        async with self._lock:
            await self._call(lambda c: c.execute("BEGIN IMMEDIATE"))
            try:
                yield self._statements
            except BaseException:
                await asyncio.shield(self._call(lambda c: c.execute("ROLLBACK")))
                raise
            await self._call(lambda c: c.execute("COMMIT"))

    async def close(self) -> None:
        """Release the file and the thread; a later statement opens them again."""
        connection, self._connection = self._connection, None
        thread, self._thread = self._thread, None
        if thread is None:
            return
        if connection is not None:
            await asyncio.get_running_loop().run_in_executor(thread, connection.close)
        thread.shutdown(wait=False)
