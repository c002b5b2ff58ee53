"""The response cache in front of a model call: a service looks its request up first; a hit is
answered by the nearest colo, a miss is made and stored, and identical requests that arrive while
it is being made wait for it (`cache/single_flight.py`); `x-edge-cache` (on the trace) says
which: HIT, JOINED or MISS."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from deployments.ingress.cache import cache_key
from deployments.ingress.cache.single_flight import Lead, SingleFlight
from deployments.ingress.edge.trace import EdgeTrace
from deployments.ingress.serving.context import RequestContext


@dataclass(frozen=True)
class CacheLookup:
    """One request's look into the cache: the answer found (`hit`, `joined` when an identical
    request made it while this one waited `waited_s`), or where a new one goes."""

    hit: Any | None
    joined: bool = False
    waited_s: float = 0.0
    _flights: SingleFlight | None = None
    _key: str | None = None  # None: not cached (bypassed, or not cacheable)
    _lead: Lead | None = None  # identical requests wait for this one's answer

    def served(self, trace: EdgeTrace) -> None:
        """Say on a hit's trace whether it waited for an identical request's answer."""
        if self.joined:
            trace.cache = "JOINED"

    def store(self, answer: Any, trace: EdgeTrace, *, whole: bool = True) -> None:
        """Keep the answer just made for the next same request, on every router replica, and
        hand it to those waiting for it; its trace says MISS. An answer that is not `whole` (cut
        by the moderation gate) is neither kept nor handed over. The backend is written behind
        the response (SingleFlight.behind): this replica's copy and its waiters' are made now."""
        if self._flights is None or self._key is None:
            return
        trace.cache = "MISS"
        if not whole:
            self.release()
        elif self._lead is not None:
            self._lead.share(answer)
        else:
            self._flights.store(self._key, answer)

    def release(self) -> None:
        """Let go of the requests waiting for this one's answer if it made none to share (it
        failed, was refused or cut); nothing once `store` shared it."""
        if self._lead is not None:
            self._lead.drop()


NOT_CACHED = CacheLookup(None)


@dataclass(frozen=True)
class CachedAnswers:
    flights: SingleFlight  # the response cache, and the answers being made for it

    async def lookup(
        self, endpoint: str, request: BaseModel, ctx: RequestContext, cacheable: bool = True
    ) -> CacheLookup:
        """The cached answer to `request` for this key, if any, or an identical request's once
        made; neither looked up nor stored when the client bypasses the cache or the request is
        not `cacheable`."""
        if ctx.cache_bypass or not cacheable or not self.flights.cache.enabled:
            return NOT_CACHED
        key = cache_key(endpoint, request, ctx.key_id)
        found = await self.flights.find(key)
        return CacheLookup(
            found.answer, found.joined, found.waited_s, self.flights, key, found.lead
        )
