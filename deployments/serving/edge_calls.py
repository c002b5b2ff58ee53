"""How services reach a model: through the edge dispatcher (entry colo, region, RTT, failover)
with the request's deadline, and, for a cached answer, through the colo that would have served
it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from deployments.edge import EdgeDispatcher, EdgeTrace
from deployments.observability import RequestTelemetry
from deployments.servers.base import Reply
from deployments.serving.calls import resolve
from deployments.serving.context import RequestContext

T = TypeVar("T")


def _same(reply: Any) -> Reply[Any]:
    return reply  # type: ignore[no-any-return]


@dataclass(frozen=True)
class EdgeCalls:
    dispatcher: EdgeDispatcher[Any]
    deadline_s: float  # per request, across failovers and cold starts

    async def call(
        self,
        model: str,
        ctx: RequestContext,
        telemetry: RequestTelemetry,
        call: Callable[[Any], Awaitable[T]],
        reply_of: Callable[[T], Reply[Any]] = _same,
    ) -> tuple[T, EdgeTrace]:
        """Run `call(handle)` on the deployment handle of the region the edge picks, failing
        over on 5xx; `reply_of` finds the `Reply` in its result (cold-start accounting)."""
        result, trace = await self.dispatcher.dispatch(
            model,
            ctx.location_headers,
            ctx.client_ip,
            lambda handle: resolve(call(handle)),
            reply_of=reply_of,
            deadline_s=self.deadline_s,
        )
        telemetry.routed(trace, trace.client)
        return result, trace

    async def from_cache(
        self, model: str, ctx: RequestContext, telemetry: RequestTelemetry
    ) -> EdgeTrace:
        """The trace of an answer served from the cache by the request's first-choice colo."""
        trace = await self.dispatcher.nearest(model, ctx.location_headers, ctx.client_ip)
        trace.cache = "HIT"
        telemetry.routed(trace, trace.client)
        return trace
