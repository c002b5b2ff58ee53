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
a refusal or a cut answer lets the waiters go, and one of them makes the answer again.

A lead ends at once: this replica's waiters get the answer and its local copy is kept, while the
backend's write and the mark's release follow in a task of their own (`SingleFlight.behind`), so
the response does not wait for them. The mark goes with the write, in one call to the backend,
so the other replicas' waiters find the answer once the mark is gone rather than make it
again; a write that fails leaves the mark to end by its TTL."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from deployments.config import SingleFlightConfig
from deployments.ingress.cache.response_cache import ResponseCache
from deployments.pacing import PollPacer
from edge_sim.clock import Clock, Sleep


@dataclass(frozen=True)
class Found:
    """A lookup's outcome: `answer` (None: this request makes it), `joined` when it is another
    request's answer made while this one waited `waited_s`; `lead` when this request makes the
    answer that others wait for (then it must end the lead, whatever happens)."""

    answer: Any | None
    joined: bool = False
    lead: Lead | None = None
    waited_s: float = 0.0


log = logging.getLogger("ray.serve")

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

    def share(self, answer: Any) -> None:
        """Hand `answer` to this replica's waiters and keep it here now; store it for the other
        replicas behind the response, the mark ending with the write."""
        if self._future.done():
            return
        self._flights.end(self._key, self._future, answer)
        self._stop_renewing()
        self._flights.store(self._key, answer, release_token=self._token)

    def drop(self) -> None:
        """Let the waiters go without an answer (they look again, one of them leads); the mark
        ends behind the response. Idempotent."""
        if self._future.done():
            return
        self._flights.end(self._key, self._future, None)
        self._stop_renewing()
        if self._token:
            self._flights.behind(self._release())

    def _stop_renewing(self) -> None:
        # at once, not behind: a mark outlives a write (mark_ttl_s against the store's timeout)
        if self._renewing is not None:
            self._renewing.cancel()

    async def _release(self) -> None:
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
        self._behind: set[asyncio.Task[None]] = set()  # the backend's work a response left

    async def find(self, key: str) -> Found:
        """The cached answer, or an identical request's once it is made, or this request's
        turn to make it (leading its waiters unless single flight is off or the wait ran out)."""
        started = self._clock()
        deadline = started + self._config.wait_s
        while True:
            if self._config.enabled and key not in self._flights:
                return await self._lead(key, started)  # it looks the answer up as it claims
            answer = await self.cache.get(key)
            if answer is not None:
                return Found(answer)
            if not self._config.enabled:
                return Found(None)
            flight = self._flights.get(key)
            if flight is None:
                continue  # its lead ended while we looked: lead ourselves, or find its answer
            left_s = deadline - self._clock()
            if left_s <= 0:
                return Found(None)
            try:  # shielded: a waiter that gives up or is cancelled leaves the others' future
                shared = await asyncio.wait_for(asyncio.shield(flight), left_s)
            except TimeoutError:
                return Found(None)
            if shared is not None:
                return Found(shared, joined=True, waited_s=self._clock() - started)
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

    def store(self, key: str, answer: Any, release_token: str = "") -> None:
        """`answer` kept in this replica's memory now (the next same request finds it), written
        to the backend behind the response, `release_token`'s mark removed in the same call."""
        expires_at = self.cache.keep(key, answer)
        self.behind(self.cache.write_through(key, answer, expires_at, release_token))

    def behind(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` (the backend's part of a request) as a task of its own: its thread hop or
        round trip and the store's transaction are not the response's time. Its failure is
        logged; a store's own failures never raise (ResponseCache)."""
        task = asyncio.ensure_future(work)
        self._behind.add(task)
        task.add_done_callback(self._work_done)

    async def settled(self) -> None:
        """Until the backend's work left so far is done (tests; a replica that shuts down)."""
        while self._behind:
            await asyncio.gather(*self._behind, return_exceptions=True)

    def _work_done(self, task: asyncio.Task[None]) -> None:
        self._behind.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "response cache: a write behind the response failed", exc_info=task.exception()
            )

    def end(self, key: str, future: asyncio.Future[Any], answer: Any | None) -> None:
        if self._flights.get(key) is future:
            del self._flights[key]
        if not future.done():
            future.set_result(answer)

    async def _lead(self, key: str, started: float) -> Found:
        """Lead this replica's waiters for `key`: the answer if the cache has it, else make it
        if the backend's mark is ours (or ends while we poll, or the wait runs out), else take
        the answer another replica made. Each look is one call to the backend (get_or_claim)."""
        deadline = started + self._config.wait_s
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._flights[key] = future
        token, ttl_s = secrets.token_hex(8), self._config.mark_ttl_s
        pacer = PollPacer(self._config.poll_min_ms / 1000, self._config.poll_max_ms / 1000)
        wait_s, waited, marked = pacer.fast_s, False, None
        try:
            answer, marked = await self.cache.get_or_claim(key, token, ttl_s)
            while answer is None and marked is False:
                left_s = deadline - self._clock()
                if left_s <= 0:
                    break  # past the wait: made here too, without the mark
                await self._sleep(min(wait_s, left_s))
                waited = True
                answer, marked = await self.cache.get_or_claim(key, token, ttl_s)
                wait_s = pacer.after_read(busy=False)
        except BaseException:  # cancelled (the client left) or failed: let the waiters go
            self.end(key, future, None)
            if marked:
                await self.cache.release(key, token)
            raise
        if answer is not None:
            self.end(key, future, answer)
            return Found(answer, joined=waited, waited_s=self._clock() - started)
        # marked None: no backend to mark (or it failed); False: waited out
        return Found(None, lead=Lead(self, key, future, token if marked else ""))
