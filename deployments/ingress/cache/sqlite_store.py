"""The embedded shared tier: one SQLite file (WAL) per node, shared by the router replicas on that
node without a server. Calls run on one thread of its own, so a slow disk or another replica's
write lock delays that thread, never the router's event loop; expired and surplus (oldest
first) entries are pruned as entries are written.

But the lookup on a request's path (`get_or_claim`: a read, and on a miss the "being made"
mark) is tried on the event loop first, on a connection of its own that never waits for a lock
(busy timeout 0) and never checkpoints (no fsync: the thread's connection checkpoints as it
writes): a read and a small append to the WAL in the page cache, 30-150 µs, where the hop to the
thread and back cost a request about 0.2 ms of its `x-edge-overhead-ms` live. When another
connection holds the write lock it goes to the thread as before."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from deployments.ingress.cache.store import StoreUnavailable
from deployments.sqlite_wal import enable_wal

# The table's name carries the entry format's version: a new format starts an empty table
# instead of reading entries it cannot decode.
TABLE = "response_cache_v1"
MARKS = "response_cache_marks_v1"  # "being made" marks (single_flight.py): few, short-lived
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (key TEXT PRIMARY KEY, value BLOB NOT NULL,
                                    expires_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS {TABLE}_expiry ON {TABLE} (expires_at);
CREATE TABLE IF NOT EXISTS {MARKS} (key TEXT PRIMARY KEY, token TEXT NOT NULL,
                                    expires_at REAL NOT NULL);
"""
T = TypeVar("T")


class SQLiteStore:
    name = "sqlite"

    def __init__(
        self,
        path: Path,
        max_entries: int,
        timeout_ms: float,
        clock: Callable[[], float] = time.time,  # wall time: other processes read the expiry
    ):
        self.path = path
        self.max_entries = max_entries
        # A writer waits on another replica's write lock about as long as a request waits on it.
        self._busy_timeout_s = timeout_ms / 1000
        self._clock = clock
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="edge-cache-sqlite")
        self._db: sqlite3.Connection | None = None  # only ever touched on self._thread
        # get_or_claim's connection on the event loop, opened on the loop's thread once the
        # thread's connection made the file (WAL, schema); None after it failed.
        self._loop_db: sqlite3.Connection | None = None
        self._loop_thread: int | None = None

    async def get(self, key: str) -> bytes | None:
        return await self._on_thread(self._get, key)

    async def put(self, key: str, value: bytes, ttl_s: float, release_token: str = "") -> None:
        await self._on_thread(self._put, key, value, ttl_s, release_token)

    async def claim(self, key: str, token: str, ttl_s: float) -> bool:
        return await self._on_thread(self._claim, key, token, ttl_s)

    async def get_or_claim(self, key: str, token: str, ttl_s: float) -> bytes | bool:
        """On the event loop when the file's write lock is free, else on the thread."""
        found = self._get_or_claim_at_once(key, token, ttl_s)
        if found is not None:
            return found
        return await self._on_thread(self._get_or_claim, key, token, ttl_s)

    async def renew(self, key: str, token: str, ttl_s: float) -> bool:
        return await self._on_thread(self._renew, key, token, ttl_s)

    async def release(self, key: str, token: str) -> None:
        await self._on_thread(self._release, key, token)

    async def close(self) -> None:
        self._close_loop_db()
        await self._on_thread(self._close)
        self._thread.shutdown(wait=False)

    async def _on_thread(self, call: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, call, *args)

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None)
            try:
                enable_wal(db, self._busy_timeout_s)  # readers never wait on a writer
                # A crash may lose the last entries written, never corrupt the file: a cache.
                db.execute("PRAGMA synchronous=NORMAL")
                db.executescript(SCHEMA)
            except BaseException:
                db.close()
                raise
            self._db = db
        return self._db

    def _get(self, key: str) -> bytes | None:
        try:
            return self._entry(self._connection(), key, self._clock())
        except (sqlite3.Error, OSError) as error:
            raise self._lost(error) from error

    @staticmethod
    def _entry(db: sqlite3.Connection, key: str, now: float) -> bytes | None:
        row = db.execute(
            f"SELECT value FROM {TABLE} WHERE key = ? AND expires_at > ?", (key, now)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def _put(self, key: str, value: bytes, ttl_s: float, release_token: str) -> None:
        now = self._clock()
        try:
            db = self._connection()
            with db:  # one transaction: the entry and the pruning it makes necessary
                db.execute("BEGIN IMMEDIATE")
                db.execute(
                    f"INSERT OR REPLACE INTO {TABLE} (key, value, expires_at) VALUES (?, ?, ?)",
                    (key, value, now + ttl_s),
                )
                db.execute(f"DELETE FROM {TABLE} WHERE expires_at <= ?", (now,))
                db.execute(
                    f"DELETE FROM {TABLE} WHERE key IN (SELECT key FROM {TABLE} "
                    "ORDER BY expires_at DESC LIMIT -1 OFFSET ?)",
                    (self.max_entries,),
                )
                if release_token:
                    self._unmark(db, key, release_token)
        except (sqlite3.Error, OSError) as error:
            raise self._lost(error) from error

    def _claim(self, key: str, token: str, ttl_s: float) -> bool:
        now = self._clock()
        try:
            db = self._connection()
            with db:
                db.execute("BEGIN IMMEDIATE")
                return self._mark(db, key, token, now + ttl_s, now)
        except (sqlite3.Error, OSError) as error:
            raise self._lost(error) from error

    def _get_or_claim(self, key: str, token: str, ttl_s: float) -> bytes | bool:
        try:
            return self._entry_or_mark(self._connection(), key, token, ttl_s)
        except (sqlite3.Error, OSError) as error:
            raise self._lost(error) from error

    def _get_or_claim_at_once(self, key: str, token: str, ttl_s: float) -> bytes | bool | None:
        """`_get_or_claim` on the loop's connection; None where it would wait (another writer
        holds the lock), failed, or the file is not made yet: then the thread answers."""
        db = self._loop_connection()
        if db is None:
            return None
        try:
            return self._entry_or_mark(db, key, token, ttl_s)
        except (sqlite3.Error, OSError) as error:
            if "locked" not in str(error):  # not a lock held: the thread's call reports it
                self._close_loop_db()  # and opens the file anew
            return None

    def _entry_or_mark(
        self, db: sqlite3.Connection, key: str, token: str, ttl_s: float
    ) -> bytes | bool:
        """A read without the write lock first: a hit (another replica's answer) takes none."""
        now = self._clock()
        if (value := self._entry(db, key, now)) is not None:
            return value
        with db:
            db.execute("BEGIN IMMEDIATE")
            # again under the lock: an entry written since the read above is the answer
            if (value := self._entry(db, key, now)) is not None:
                return value
            return self._mark(db, key, token, now + ttl_s, now)

    def _loop_connection(self) -> sqlite3.Connection | None:
        if self._db is None:  # the thread's connection makes the file (WAL, schema) first,
            self._close_loop_db()  # and after it failed opens it anew (it may be a new file)
            return None
        here = threading.get_ident()
        if self._loop_db is None:
            try:
                db = sqlite3.connect(self.path, timeout=0, isolation_level=None)
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("PRAGMA wal_autocheckpoint=0")
            except (sqlite3.Error, OSError):
                return None
            self._loop_db, self._loop_thread = db, here
        return self._loop_db if self._loop_thread == here else None

    def _close_loop_db(self) -> None:
        if self._loop_db is not None and self._loop_thread == threading.get_ident():
            self._loop_db.close()
            self._loop_db = None

    @staticmethod
    def _mark(db: sqlite3.Connection, key: str, token: str, expires_at: float, now: float) -> bool:
        """Set `token`'s mark on `key` unless a live one is there, in the caller's transaction."""
        db.execute(f"DELETE FROM {MARKS} WHERE expires_at <= ?", (now,))
        taken = db.execute(
            f"INSERT OR IGNORE INTO {MARKS} (key, token, expires_at) VALUES (?, ?, ?)",
            (key, token, expires_at),
        ).rowcount
        return bool(taken == 1)

    def _renew(self, key: str, token: str, ttl_s: float) -> bool:
        now = self._clock()
        try:
            renewed = (
                self._connection()
                .execute(
                    f"UPDATE {MARKS} SET expires_at = ? "
                    "WHERE key = ? AND token = ? AND expires_at > ?",
                    (now + ttl_s, key, token, now),
                )
                .rowcount
            )
        except (sqlite3.Error, OSError) as error:
            raise self._lost(error) from error
        return renewed == 1

    def _release(self, key: str, token: str) -> None:
        try:
            self._unmark(self._connection(), key, token)
        except (sqlite3.Error, OSError) as error:
            raise self._lost(error) from error

    @staticmethod
    def _unmark(db: sqlite3.Connection, key: str, token: str) -> None:
        db.execute(f"DELETE FROM {MARKS} WHERE key = ? AND token = ?", (key, token))

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def _lost(self, error: BaseException) -> StoreUnavailable:
        """Drop the connection (the next call opens the file anew: it may have been replaced)."""
        self._close()
        return StoreUnavailable(f"sqlite {self.path}: {error}")
