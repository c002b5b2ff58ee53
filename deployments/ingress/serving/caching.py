"""The response cache in front of a model call: a service looks its request up first; a hit is
answered by the nearest colo, a miss is made and stored; `x-edge-cache` (on the trace) says
which."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from deployments.ingress.cache import ResponseCache, cache_key
from deployments.ingress.edge.trace import EdgeTrace
from deployments.ingress.serving.context import RequestContext


@dataclass(frozen=True)
class CacheLookup:
    """One request's look into the cache: the answer found (`hit`), or where a new one goes."""

    hit: Any | None
    _cache: ResponseCache | None = None
    _key: str | None = None  # None: not cached (bypassed, or not cacheable)

    async def store(self, answer: Any, trace: EdgeTrace) -> None:
        """Keep the answer just made for the next same request, on every router replica; its
        trace says MISS."""
        if self._cache is not None and self._key is not None:
            await self._cache.put(self._key, answer)
            trace.cache = "MISS"


NOT_CACHED = CacheLookup(None)


@dataclass(frozen=True)
class CachedAnswers:
    cache: ResponseCache

    async def lookup(
        self, endpoint: str, request: BaseModel, ctx: RequestContext, cacheable: bool = True
    ) -> CacheLookup:
        """The cached answer to `request` for this key, if any; neither looked up nor stored when
        the client bypasses the cache or the request is not `cacheable`."""
        if ctx.cache_bypass or not cacheable or not self.cache.enabled:
            return NOT_CACHED
        key = cache_key(endpoint, request, ctx.key_id)
        return CacheLookup(await self.cache.get(key), self.cache, key)
