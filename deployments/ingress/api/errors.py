"""Every failure leaves the router as an error body in the shape of the API its route belongs to
(OpenAI's, or Workers AI's envelope), with the error's own headers: one handler, never a stack
trace."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from deployments.errors import (
    InternalServerError,
    InvalidRequestError,
    MethodNotAllowedError,
    PayloadTooLargeError,
    RouteNotFoundError,
    ServingError,
)
from deployments.ingress.edge.calls import as_serving_error
from deployments.ingress.protocol import request_error_from_validation

ErrorBody = Callable[[ServingError], dict[str, Any]]


def openai_error_body(error: ServingError) -> dict[str, Any]:
    return error.to_error_body()


class ErrorShapes:
    """Which error body a path gets: that of the API whose route prefix it is under, else
    OpenAI's. By path, so errors raised before any route runs (bad JSON, 404, 405, 413) get it
    too."""

    def __init__(
        self,
        by_prefix: Mapping[str, ErrorBody],
        default: ErrorBody = openai_error_body,
        by_pattern: Mapping[str, ErrorBody] | None = None,
    ):
        self._by_prefix = dict(by_prefix)
        self._default = default
        # Regular expressions, for prefixes with a path parameter (Cloudflare's account id).
        self._by_pattern = [(re.compile(p), body) for p, body in (by_pattern or {}).items()]

    def body_for(self, path: str) -> ErrorBody:
        for pattern, body in self._by_pattern:
            if pattern.match(path):
                return body
        for prefix, body in self._by_prefix.items():
            if path == prefix or path.startswith(prefix + "/"):
                return body
        return self._default

    def response(self, error: ServingError, path: str) -> JSONResponse:
        return JSONResponse(
            self.body_for(path)(error), status_code=error.status, headers=error.response_headers()
        )


def serving_error_of(exc: Exception, method: str, path: str) -> ServingError:
    """Any exception a request raised, as the error the client sees."""
    if isinstance(exc, ServingError):
        return exc
    if isinstance(exc, RequestValidationError):
        return request_error_from_validation(exc.errors())
    if isinstance(exc, StarletteHTTPException):
        if exc.status_code == 404:
            return RouteNotFoundError(f"no route {path}")
        if exc.status_code == 405:
            allow = (exc.headers or {}).get("Allow")
            return MethodNotAllowedError(f"{method} is not allowed on {path}", allow=allow)
        if exc.status_code == 413:
            return PayloadTooLargeError(str(exc.detail))
        if exc.status_code < 500:
            return InvalidRequestError(str(exc.detail))
        return InternalServerError("internal error")
    return as_serving_error(exc)


def install_error_handler(app: FastAPI, shapes: ErrorShapes) -> None:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        path = request.url.path
        return shapes.response(serving_error_of(exc, request.method, path), path)

    for kind in (ServingError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, handle)
