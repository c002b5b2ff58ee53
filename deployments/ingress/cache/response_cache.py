"""The response cache a router replica asks: an optional in-process tier in front of a shared
store (`store.py`). Every wait on the store is bounded; a store that fails or is too slow makes
the lookup a miss (counted by reason), is left alone for `retry_after_s`, then asked again, so
it comes back by itself. Entries never change within their time to live, so a local copy is
always the store's answer; it lives only until the entry's own expiry."""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from cachetools import TLRUCache

from deployments.config import CacheConfig
from deployments.ingress.cache.codec import CodecError, decode_answer, encode_answer
from deployments.ingress.cache.store import SharedStore, StoreUnavailable

# What the store holds: the entry's expiry (wall time, seconds) and then the encoded answer, so a
# replica that reads an entry keeps its local copy no longer than the entry lives.
ENVELOPE = struct.Struct("<d")
# Calls waiting on the store at once, at most: beyond it a lookup is a miss without asking, so a
# stalled store holds a bounded number of requests, each for at most timeout_ms.
MAX_STORE_CALLS_IN_FLIGHT = 64

FailureCounter = Callable[[str, str, str], None]
"""Counts one failed store call: (backend, operation: get|lookup|put|claim|renew|release, reason:
timeout|error|busy|down|corrupt); lookup is get_or_claim."""

log = logging.getLogger("ray.serve")
T = TypeVar("T")


class ResponseCache:
    def __init__(
        self,
        config: CacheConfig,
        store: SharedStore | None = None,
        *,
        clock: Callable[[], float] = time.time,  # wall time: expiries cross processes
        on_failure: FailureCounter | None = None,
    ):
        """`store`: the shared tier (None: this process's memory alone, max_entries big)."""
        self.enabled = config.enabled
        self.store = store
        self._ttl_s = config.ttl_s
        self._timeout_s = config.timeout_ms / 1000
        self._retry_after_s = config.retry_after_s
        self._clock = clock
        self._on_failure = on_failure
        local_size = config.local_entries if store is not None else config.max_entries
        self._local: TLRUCache[str, tuple[float, Any]] | None = (
            TLRUCache(local_size, ttu=_expiry_of, timer=clock) if local_size else None
        )
        self._in_flight = 0
        self._retry_at = 0.0  # the store is not asked before this time (it failed)
        self._down = False

    async def get(self, key: str) -> Any | None:
        """The cached answer, or None: not cached, expired, or the store failed."""
        if not self.enabled:
            return None
        if (answer := self._local_answer(key)) is not None or self.store is None:
            return answer
        store = self.store
        data = await self._ask("get", lambda: store.get(key))
        return None if data is None else self._unpacked("get", key, data)

    async def get_or_claim(
        self, key: str, token: str, ttl_s: float
    ) -> tuple[Any | None, bool | None]:
        """`get`, and on a miss `claim`, in one call to the store (one thread hop or round trip
        on a request's path, not three): (the answer, None), or (None, claim's answer)."""
        if not self.enabled:
            return None, None
        if (answer := self._local_answer(key)) is not None or self.store is None:
            return answer, None
        store = self.store
        found = await self._ask("lookup", lambda: store.get_or_claim(key, token, ttl_s))
        if not isinstance(found, bytes):
            return None, found
        if (answer := self._unpacked("lookup", key, found)) is not None:
            return answer, None
        return None, await self.claim(key, token, ttl_s)  # an entry we cannot use: made again

    async def put(self, key: str, answer: Any) -> None:
        """Keep `answer` for ttl_s; written through to the store (a bounded wait), so the next
        same request finds it on any replica. A failed write is counted, never raised."""
        if self.enabled:
            await self.write_through(key, answer, self.keep(key, answer))

    def keep(self, key: str, answer: Any) -> float:
        """`put`'s first half, at once: `answer` kept in this replica's memory for ttl_s (a
        request arriving next finds it); its expiry, for `write_through`."""
        expires_at = self._clock() + self._ttl_s
        if self.enabled:
            self._keep_local(key, expires_at, answer)
        return expires_at

    async def write_through(
        self, key: str, answer: Any, expires_at: float, release_token: str = ""
    ) -> None:
        """`put`'s second half: the answer `keep` kept, written to the store with its expiry;
        `release_token`'s mark on the key goes with it (SharedStore.put)."""
        if self.enabled and self.store is not None:
            store, data = self.store, ENVELOPE.pack(expires_at) + encode_answer(answer)
            await self._ask("put", lambda: store.put(key, data, self._ttl_s, release_token))

    async def claim(self, key: str, token: str, ttl_s: float) -> bool | None:
        """Whether this replica makes the key's answer: True, the store's "being made" mark is
        now `token`'s; False, another replica holds it; None, no store to share the work with,
        or one that is down or failed (each replica makes its own, as without the mark)."""
        if self.store is None or self._clock() < self._retry_at:  # a store left alone: uncounted
            return None
        store = self.store
        return await self._ask("claim", lambda: store.claim(key, token, ttl_s))

    async def renew(self, key: str, token: str, ttl_s: float) -> bool | None:
        """Extend the mark `claim` set: True, still `token`'s; False, it is not any more; None,
        the store is down or failed (the mark may still end by its TTL)."""
        if self.store is None or self._clock() < self._retry_at:
            return None
        store = self.store
        return await self._ask("renew", lambda: store.renew(key, token, ttl_s))

    async def release(self, key: str, token: str) -> None:
        """Remove the mark `claim` set (a failure is counted: the mark then ends by its TTL)."""
        if self.store is not None and self._clock() >= self._retry_at:
            store = self.store
            await self._ask("release", lambda: store.release(key, token))

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()

    def _local_answer(self, key: str) -> Any | None:
        if self._local is not None and (entry := self._local.get(key)) is not None:
            return entry[1]
        return None

    def _unpacked(self, operation: str, key: str, data: bytes) -> Any | None:
        """The answer in a store's entry, kept locally until the entry's expiry; None if it
        does not decode (counted) or has expired."""
        try:
            (expires_at,) = ENVELOPE.unpack_from(data)
            answer = decode_answer(data[ENVELOPE.size :])
        except (struct.error, CodecError) as error:
            log.warning("response cache: an entry that does not decode is a miss: %s", error)
            self._count_failure(operation, "corrupt")
            return None
        if expires_at <= self._clock():  # the store's clock may be ahead of ours
            return None
        self._keep_local(key, expires_at, answer)
        return answer

    def _keep_local(self, key: str, expires_at: float, answer: Any) -> None:
        if self._local is not None:
            self._local[key] = (expires_at, answer)

    async def _ask(self, operation: str, call: Callable[[], Awaitable[T]]) -> T | None:
        """The store's answer, or None when it is down, busy, failing or slower than the
        timeout."""
        if self._clock() < self._retry_at:
            self._count_failure(operation, "down")
            return None
        if self._in_flight >= MAX_STORE_CALLS_IN_FLIGHT:
            self._count_failure(operation, "busy")
            return None
        self._in_flight += 1
        try:
            async with asyncio.timeout(self._timeout_s):  # no Task per call, as wait_for makes
                result = await call()
        except TimeoutError:
            self._failed(operation, "timeout", f"no answer within {self._timeout_s * 1000:g} ms")
            return None
        except StoreUnavailable as error:
            self._failed(operation, "error", str(error))
            return None
        finally:
            self._in_flight -= 1
        if self._down:
            self._down = False
            log.info("response cache: the %s backend answers again", self._backend)
        return result

    def _failed(self, operation: str, reason: str, detail: str) -> None:
        self._count_failure(operation, reason)
        self._retry_at = self._clock() + self._retry_after_s
        if not self._down:
            self._down = True
            log.warning(
                "response cache: the %s backend failed (%s: %s); lookups are misses, it is "
                "asked again every %g s",
                self._backend,
                operation,
                detail,
                self._retry_after_s,
            )

    def _count_failure(self, operation: str, reason: str) -> None:
        if self._on_failure is not None:
            self._on_failure(self._backend, operation, reason)

    @property
    def _backend(self) -> str:
        return self.store.name if self.store is not None else "memory"


def _expiry_of(_key: str, entry: tuple[float, Any], _now: float) -> float:
    return entry[0]
