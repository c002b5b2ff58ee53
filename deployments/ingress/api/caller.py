"""Who calls and from where: the API key checked (401 before the body is validated), and the
request's `RequestContext` (its telemetry included), which is all a service gets of it."""

from __future__ import annotations

from fastapi import Request

from deployments.ingress.api.app_services import services_of
from deployments.ingress.cache import wants_bypass
from deployments.ingress.edge.waiting import WaitLimits
from deployments.ingress.serving.context import RequestContext, session_of
from deployments.observability import request_telemetry


async def authenticated(request: Request) -> RequestContext:
    """The FastAPI dependency of a model route. `async` though it never awaits: FastAPI runs a
    plain `def` dependency in its thread pool, a thread hop per request that cost the router more
    CPU than the key check itself."""
    principal = services_of(request).keys.authenticate(request.headers.get("authorization"))
    telemetry = request_telemetry(request)
    telemetry.authenticated(principal.key_id, principal.collect_payloads)
    return RequestContext(
        principal=principal,
        request_id=request.headers.get("x-request-id") or telemetry.request_id,
        traceparent=telemetry.traceparent,
        client_ip=request.client.host if request.client else None,
        location_headers=RequestContext.location_of(request.headers),
        cache_bypass=wants_bypass(request.headers),
        wait_limits=WaitLimits.from_headers(request.headers),
        session=session_of(request.headers),
        telemetry=telemetry,
    )
