"""The one interface both database backends offer the access layer: statements with `?`
placeholders, run alone or in a transaction, and a closed set of failures. The SQL the access
layer writes is the common part of SQLite's and PostgreSQL's dialects (upserts, RETURNING)."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

Dialect = Literal["sqlite", "postgres"]
Row = tuple[Any, ...]


class StoreUnavailable(RuntimeError):
    """The database did not answer (down, unreachable, timed out): the caller retries later or
    falls back; never a client's error."""


class Statements(Protocol):
    """What runs statements: the database itself (each statement its own transaction), or one
    open transaction."""

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed."""
        ...

    async def execute_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None: ...

    async def fetch(self, sql: str, args: Sequence[Any] = ()) -> list[Row]: ...


class Database(Statements, Protocol):
    dialect: Dialect

    def transaction(self) -> AbstractAsyncContextManager[Statements]:
        """Statements that commit together (or not at all). SQLite takes its write lock at the
        start, so two processes never interleave; PostgreSQL's rows lock as they are written."""
        ...

    async def close(self) -> None: ...
