"""The request body limit: bodies over it are refused with 413 before anything reads them; a body
without a Content-Length is counted as it arrives."""

from __future__ import annotations

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.errors import PayloadTooLargeError
from deployments.ingress.api.errors import ErrorShapes


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, limit: int, shapes: ErrorShapes):
        self.app = app
        self.limit = limit
        self.shapes = shapes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            error = PayloadTooLargeError(too_large_message(limit))
            await self.shapes.response(error, scope["path"])(scope, _no_body, send)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                # FastAPI re-raises HTTPExceptions from body reading; the error handler makes
                # it a 413.
                raise StarletteHTTPException(413, too_large_message(limit))
            return message

        await self.app(scope, counting_receive, send)


def too_large_message(limit: int) -> str:
    return f"request body exceeds the limit of {limit} bytes"


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}
