"""The SQLite cache's lookup on a request's path (`get_or_claim`): answered on the router's event
loop while the file's write lock is free (no hop to the store's thread), on the thread while
another replica holds the lock (the loop keeps running), and on a fresh connection after the
file failed."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from deployments.ingress.cache.sqlite_store import SQLiteStore

TTL_S = 60.0


class ThreadCalls:
    """Counts the store's calls that went to its thread."""

    def __init__(self, store: SQLiteStore):
        self.names: list[str] = []
        on_thread = store._on_thread

        async def counted(call: Callable[..., Any], *args: object) -> Any:
            self.names.append(call.__name__)
            return await on_thread(call, *args)

        store._on_thread = counted  # type: ignore[method-assign]


def run(scenario: Callable[[SQLiteStore], Awaitable[Any]], path: Path) -> Any:
    async def in_loop() -> Any:
        store = SQLiteStore(path, 100, 10_000)
        try:
            return await scenario(store)
        finally:
            await store.close()

    return asyncio.run(in_loop())


def test_a_lookup_on_a_free_file_is_answered_on_the_loop(tmp_path: Path):
    async def scenario(store: SQLiteStore) -> tuple[Any, ...]:
        await store.put("made", b"answer", TTL_S)  # the thread's connection makes the file
        calls = ThreadCalls(store)
        hit = await store.get_or_claim("made", "t1", TTL_S)
        lead = await store.get_or_claim("new", "t1", TTL_S)
        follower = await store.get_or_claim("new", "t2", TTL_S)  # the mark is t1's
        return hit, lead, follower, list(calls.names)

    assert run(scenario, tmp_path / "cache.sqlite3") == (b"answer", True, False, [])


def test_the_loops_mark_is_the_one_the_threads_answer_releases(tmp_path: Path):
    async def scenario(store: SQLiteStore) -> tuple[Any, ...]:
        await store.put("other", b"x", TTL_S)
        claimed = await store.get_or_claim("k", "lead", TTL_S)
        await store.put("k", b"made", TTL_S, release_token="lead")  # on the thread
        after = await store.get_or_claim("k", "late", TTL_S)
        return claimed, after, await store.claim("k", "late", TTL_S)

    assert run(scenario, tmp_path / "cache.sqlite3") == (True, b"made", True)


def test_a_lookup_while_another_writer_holds_the_lock_waits_on_the_thread(tmp_path: Path):
    path = tmp_path / "cache.sqlite3"

    async def scenario(store: SQLiteStore) -> tuple[Any, ...]:
        await store.put("other", b"x", TTL_S)
        calls = ThreadCalls(store)
        other_replica = sqlite3.connect(path, isolation_level=None)
        other_replica.execute("BEGIN IMMEDIATE")  # its write lock, held
        lookup = asyncio.ensure_future(store.get_or_claim("k", "lead", TTL_S))
        for _ in range(100):  # the loop runs on while the lookup waits for the lock
            await asyncio.sleep(0)
        waiting = not lookup.done()
        other_replica.execute("COMMIT")
        other_replica.close()
        return waiting, await lookup, list(calls.names)

    assert run(scenario, path) == (True, True, ["_get_or_claim"])


def test_after_the_file_failed_the_loop_opens_it_anew(tmp_path: Path):
    path = tmp_path / "data" / "cache.sqlite3"

    async def scenario(store: SQLiteStore) -> tuple[Any, ...]:
        await store.put("k", b"first", TTL_S)
        assert await store.get_or_claim("k", "t", TTL_S) == b"first"
        path.unlink()  # the file replaced under the router (an operator cleared the cache)
        for stale in (path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            stale.unlink(missing_ok=True)
        lost = sqlite3.OperationalError("disk I/O error")  # as a call on the thread reports it:
        await asyncio.get_running_loop().run_in_executor(store._thread, store._lost, lost)
        calls = ThreadCalls(store)
        reopened = await store.get_or_claim("k", "t", TTL_S)  # the thread makes the new file
        await store.put("k", b"second", TTL_S)
        return reopened, await store.get_or_claim("k", "t", TTL_S), list(calls.names)

    assert run(scenario, path) == (True, b"second", ["_get_or_claim", "_put"])
