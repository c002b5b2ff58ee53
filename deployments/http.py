"""HTTP plumbing of the router: the body-size limit, and every error as OpenAI JSON."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from deployments.errors import (
    InternalServerError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    QueueFullError,
    RateLimitedError,
    ServingError,
)
from deployments.protocol import request_error_from_validation

log = logging.getLogger("ray.serve")


def error_headers(error: ServingError) -> dict[str, str]:
    """Retry-After for 503s, and the x-ratelimit-* state with it for 429s."""
    if isinstance(error, RateLimitedError):
        return error.response_headers()
    if isinstance(error, OverloadedError):
        return {"retry-after": str(max(1, math.ceil(error.retry_after_s)))}
    return {}


def error_response(error: ServingError) -> JSONResponse:
    headers = error_headers(error)
    return JSONResponse(error.to_error_body(), status_code=error.status, headers=headers)


def as_serving_error(exc: BaseException) -> ServingError:
    """Whatever a model call raised, as the one error the client should see."""
    from ray import exceptions as ray_exceptions
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    cause = getattr(exc, "cause", None)  # RayTaskError wraps what the replica raised
    if isinstance(cause, ServingError):
        return cause
    if isinstance(exc, ServingError):
        return exc
    if isinstance(exc, BackPressureError):
        return QueueFullError("the model's queue is full; retry shortly", retry_after_s=1)
    if isinstance(exc, DeploymentUnavailableError):
        return OverloadedError("the model is not available right now", retry_after_s=5)
    if isinstance(exc, TimeoutError | ray_exceptions.GetTimeoutError):
        return OverloadedError("the model did not answer in time", retry_after_s=2)
    if isinstance(exc, ray_exceptions.RayActorError | ray_exceptions.ActorDiedError):
        return OverloadedError("the model replica died; retry", retry_after_s=1)
    log.exception("unexpected error from a model call", exc_info=exc)
    return InternalServerError("internal error while serving the request")


def install_error_handlers(app: FastAPI) -> None:
    """Every failure leaves the router as an OpenAI-shaped JSON body: never a stack trace."""

    @app.exception_handler(ServingError)
    async def _serving(request: Request, exc: ServingError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(request_error_from_validation(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        error: ServingError
        if exc.status_code == 404:
            error = ModelNotFoundError(f"no route {request.url.path}", code="route_not_found")
        elif exc.status_code == 413:
            error = PayloadTooLargeError(str(exc.detail))
        elif exc.status_code == 405:
            error = InvalidRequestError(f"{request.method} is not allowed on {request.url.path}")
            return JSONResponse(error.to_error_body(), status_code=405)
        elif exc.status_code < 500:
            error = InvalidRequestError(str(exc.detail))
        else:
            error = InternalServerError("internal error")
        return error_response(error)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(as_serving_error(exc))


class BodyLimitMiddleware:
    """Refuse bodies over the limit with 413 before anything reads them; a body without a
    Content-Length is counted as it arrives."""

    def __init__(self, app: ASGIApp, limit: Callable[[], int]):
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit()
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._too_large(scope, send, limit)
            return
        seen = 0

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit:
                # FastAPI re-raises HTTPExceptions from body reading; our handler makes it a 413.
                raise StarletteHTTPException(413, _too_large_message(limit))
            return message

        await self.app(scope, counting_receive, send)

    async def _too_large(self, scope: Scope, send: Send, limit: int) -> None:
        response = error_response(PayloadTooLargeError(_too_large_message(limit)))
        await response(scope, _no_body, send)


def _too_large_message(limit: int) -> str:
    return f"request body exceeds the limit of {limit} bytes"


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}
