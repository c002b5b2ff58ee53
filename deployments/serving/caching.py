"""The response cache in front of a service call: a hit is answered by the nearest colo, a miss is
made and stored; `x-edge-cache` (on the trace) says which."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel

from deployments.cache import ResponseCache
from deployments.edge import EdgeTrace
from deployments.observability import RequestTelemetry
from deployments.serving.context import RequestContext
from deployments.serving.edge_calls import EdgeCalls

T = TypeVar("T")


@dataclass(frozen=True)
class CachedAnswers:
    cache: ResponseCache
    edge: EdgeCalls

    async def get_or_make(
        self,
        endpoint: str,
        model: str,
        request: BaseModel,
        ctx: RequestContext,
        telemetry: RequestTelemetry,
        make: Callable[[], Awaitable[tuple[T, EdgeTrace]]],
    ) -> tuple[T, EdgeTrace]:
        if ctx.cache_bypass:
            return await make()
        key = self.cache.key(endpoint, request, ctx.key_id)
        cached: T | None = self.cache.get(key)
        if cached is not None:
            return cached, await self.edge.from_cache(model, ctx, telemetry)
        answer, trace = await make()
        self.cache.put(key, answer)
        trace.cache = "MISS"
        return answer, trace
