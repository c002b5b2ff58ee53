"""One miss, one model call: identical cacheable requests that arrive while the first is being
answered wait for its answer instead of calling the model again. On a router replica, through a
future per key in its memory; across the replicas that share the cache's backend (a node's with
SQLite, the cluster's with Redis), through the backend's short "being made" mark: the replica that
holds it makes the answer, the first waiter of each other replica polls the backend for the
answer or the mark's end, and the others on that replica wait for that waiter. A waiter never
waits past `wait_s`: then it calls the model itself. The lead renews its mark every third of
`mark_ttl_s` while its model call lasts (a long generation does not let the mark lapse and the
other replicas call the model too), and stops once it shares or drops the answer; a lead that
dies stops renewing, so its mark still ends by its TTL. Only a whole answer is shared: an error,
a refusal or a cut answer lets the waiters go, and one of them makes the answer again."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass
from typing import Any

from deployments.config import SingleFlightConfig
from deployments.ingress.cache.response_cache import ResponseCache
from deployments.pacing import PollPacer
from edge_sim.clock import Clock, Sleep


@dataclass(frozen=True)
class Found:
    """A lookup's outcome: `answer` (None: this request makes it), `joined` when it is another
    request's answer made while this one waited; `lead` when this request makes the answer that
    others wait for (then it must end the lead, whatever happens)."""

    answer: Any | None
    joined: bool = False
    lead: Lead | None = None


# How many times per mark_ttl_s a lead renews its mark: a renewal may fail or be slow twice
# before the mark would lapse.
RENEWALS_PER_TTL = 3


class Lead:
    """The request that makes a key's answer while identical ones wait: ended once, by `share`
    (a whole answer, stored and handed to the waiters) or `drop` (none to share). While it
    holds the backend's mark, a task renews it."""

    def __init__(self, flights: SingleFlight, key: str, future: asyncio.Future[Any], token: str):
        self._flights, self._key, self._future = flights, key, future
        self._token = token  # the backend's mark this lead holds ("": none)
        self._renewing: asyncio.Task[None] | None = (
            asyncio.ensure_future(flights.keep_marked(key, token)) if token else None
        )

    async def share(self, answer: Any) -> None:
        """Hand `answer` to this replica's waiters, store it for the others, end the mark."""
        if self._future.done():
            return
        # No await between the hand-over and the write's start: `put` keeps the local copy
        # before it waits on the backend, so a request arriving now finds the answer.
        self._flights.end(self._key, self._future, answer)
        try:
            await self._flights.cache.put(self._key, answer)
        finally:  # even if the put is cancelled: the renewals stop, drop() would not run again
            await self._release()

    async def drop(self) -> None:
        """Let the waiters go without an answer (they look again, one of them leads); idempotent."""
        if self._future.done():
            return
        self._flights.end(self._key, self._future, None)
        await self._release()

    async def _release(self) -> None:
        if self._renewing is not None:  # before any await: however the release below ends
            self._renewing.cancel()
        if self._token:
            await self._flights.cache.release(self._key, self._token)


class SingleFlight:
    def __init__(
        self,
        cache: ResponseCache,
        config: SingleFlightConfig,
        *,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ):
        self.cache = cache
        self._config = config
        self._clock, self._sleep = clock, sleep
        self._flights: dict[str, asyncio.Future[Any]] = {}  # key -> the answer being made here

    async def find(self, key: str) -> Found:
        """The cached answer, or an identical request's once it is made, or this request's
        turn to make it (leading its waiters unless single flight is off or the wait ran out)."""
        deadline = self._clock() + self._config.wait_s
        while True:
            answer = await self.cache.get(key)
            if answer is not None:
                return Found(answer)
            if not self._config.enabled:
                return Found(None)
            flight = self._flights.get(key)
            if flight is None:
                return await self._lead(key, deadline)
            left_s = deadline - self._clock()
            if left_s <= 0:
                return Found(None)
            try:  # shielded: a waiter that gives up or is cancelled leaves the others' future
                shared = await asyncio.wait_for(asyncio.shield(flight), left_s)
            except TimeoutError:
                return Found(None)
            if shared is not None:
                return Found(shared, joined=True)
            # The leader had nothing to share (an error, a cut answer): look again.

    async def keep_marked(self, key: str, token: str) -> None:
        """Renew `token`'s mark on `key` every mark_ttl_s / RENEWALS_PER_TTL until cancelled
        (the lead ended) or the mark is no longer ours; a store that failed is asked again at
        the next turn."""
        ttl_s = self._config.mark_ttl_s
        while True:
            await self._sleep(ttl_s / RENEWALS_PER_TTL)
            if await self.cache.renew(key, token, ttl_s) is False:
                return

    def end(self, key: str, future: asyncio.Future[Any], answer: Any | None) -> None:
        if self._flights.get(key) is future:
            del self._flights[key]
        if not future.done():
            future.set_result(answer)

    async def _lead(self, key: str, deadline: float) -> Found:
        """Lead this replica's waiters for `key`: make the answer if the backend's mark is ours
        (or ends while we poll, or the wait runs out), else take the answer another replica
        made."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._flights[key] = future
        token, ttl_s = secrets.token_hex(8), self._config.mark_ttl_s
        pacer = PollPacer(self._config.poll_min_ms / 1000, self._config.poll_max_ms / 1000)
        wait_s, waited, marked = pacer.fast_s, False, None
        try:
            while (marked := await self.cache.claim(key, token, ttl_s)) is False:
                left_s = deadline - self._clock()
                if left_s <= 0:
                    break  # past the wait: made here too, without the mark
                await self._sleep(min(wait_s, left_s))
                waited = True
                answer = await self.cache.get(key)
                if answer is not None:
                    self.end(key, future, answer)
                    return Found(answer, joined=True)
                wait_s = pacer.after_read(busy=False)
            if not marked:  # None: no backend to mark (or it failed); False: waited out
                token = ""
            elif (answer := await self.cache.get(key)) is not None:
                # Made by another between our look and our claim: its mark goes once it is in.
                self.end(key, future, answer)
                await self.cache.release(key, token)
                return Found(answer, joined=waited)
        except BaseException:  # cancelled (the client left) or failed: let the waiters go
            self.end(key, future, None)
            if marked:
                await self.cache.release(key, token)
            raise
        return Found(None, lead=Lead(self, key, future, token))
