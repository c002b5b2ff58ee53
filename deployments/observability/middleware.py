"""ASGI middleware that gives every router request its RequestTelemetry and finishes it after
the last byte (streams included), whatever the endpoint returned or raised; an answer that
reached a model starts with the router's own time in it, `x-edge-overhead-ms`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.observability.edge_overhead import OVERHEAD_HEADER
from deployments.observability.outcome import CLIENT_CLOSED_REQUEST
from deployments.observability.router_telemetry import RequestTelemetry, RouterObservability

STATE_KEY = "edge_telemetry"


def request_telemetry(request: Any) -> RequestTelemetry:
    """The telemetry of a Starlette request (or an ASGI scope); a disabled one when the
    middleware did not run, so endpoints never need a None check."""
    scope = request if isinstance(request, dict) else request.scope
    telemetry = scope.get("state", {}).get(STATE_KEY)
    return telemetry if telemetry is not None else RequestTelemetry.disabled()


class TelemetryMiddleware:
    """`observability` None: telemetry off (requests pass through untouched)."""

    def __init__(
        self,
        app: ASGIApp,
        observability: RouterObservability | None,
        request_id: Callable[[], str | None] | None = None,
    ):
        self.app = app
        self._observability = observability
        self._request_id = request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        observability = self._observability if scope["type"] == "http" else None
        if observability is None or not observability.traced(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        telemetry = observability.begin(
            method=scope["method"],
            path=scope["path"],
            headers=headers,
            request_id=self._request_id() if self._request_id else None,
        )
        scope.setdefault("state", {})[STATE_KEY] = telemetry
        status = 500  # if the app raises before starting a response

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                overhead_ms = telemetry.overhead.ms()  # until now: a stream's first byte
                if overhead_ms is not None:
                    telemetry.overhead_ms = overhead_ms
                    header = (OVERHEAD_HEADER.encode(), f"{overhead_ms:.3f}".encode())
                    message = {**message, "headers": [*message.get("headers", ()), header]}
            elif message["type"] == "http.response.body" and message.get("body"):
                telemetry.first_token()  # a stream's first event carries its first token
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        except asyncio.CancelledError:
            telemetry.finish(CLIENT_CLOSED_REQUEST)
            raise
        except BaseException as error:
            telemetry.failed(error)
            telemetry.finish(500)
            raise
        telemetry.finish(status)
