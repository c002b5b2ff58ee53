"""WAL on an SQLite file shared by the router processes of a machine (the response cache, the
gateway state): the one way both open it."""

from __future__ import annotations

import sqlite3
import time


def enable_wal(connection: sqlite3.Connection, wait_s: float) -> None:
    """WAL on the file, waiting up to `wait_s` for a lock: switching a new file's journal mode
    needs its lock and SQLite answers "database is locked" at once instead of calling the busy
    handler, so two routers opening a new file together would fail without it. The connection
    is closed when it fails."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            connection.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                connection.close()
                raise
            time.sleep(0.01)
