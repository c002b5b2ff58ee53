"""Turn a failed request validation into the one message and `param` that a 400 shows, and into
the matching `ServingError` (the hierarchy itself lives in `deployments.errors`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from deployments.errors import (
    EmptyInputError,
    InvalidRequestError,
    InvalidUTF8Error,
    UnsupportedParameterError,
)
from deployments.ingress.protocol.common import EMPTY_INPUT, INVALID_UTF8, UNSUPPORTED_PARAMETER

# Past a few errors a message stops being read; the count of the rest is enough.
MAX_LISTED_ERRORS = 3

# FastAPI puts a request body's errors under "body"; a client never sent a field of that name.
_BODY_LOC = "body"
# pydantic names the branch of a union in the location ("str", "list[str]", "TextContentPart",
# "function-after[...]"); our field names are snake_case, so these never collide with them.
_SCALAR_TAGS = frozenset({"str", "int", "float", "bool", "none", "list", "dict"})
# Prefixes pydantic adds to plain ValueError/AssertionError messages.
_NOISE_PREFIXES = ("Value error, ", "Assertion failed, ")

_ERROR_CLASS_BY_TYPE: Mapping[str, type[InvalidRequestError]] = MappingProxyType(
    {
        INVALID_UTF8: InvalidUTF8Error,
        EMPTY_INPUT: EmptyInputError,
        UNSUPPORTED_PARAMETER: UnsupportedParameterError,
    }
)


@dataclass(frozen=True)
class ValidationProblem:
    message: str
    param: str | None
    error_type: str


def _is_union_tag(part: str | int) -> bool:
    return isinstance(part, str) and (
        part in _SCALAR_TAGS or "[" in part or "-" in part or part[:1].isupper()
    )


def field_path(loc: Sequence[str | int]) -> str:
    """`("body", "messages", 0, "content", "str")` -> `"messages.0.content"`."""
    parts = list(loc)
    if parts and parts[0] == _BODY_LOC:
        parts = parts[1:]
    return ".".join(str(part) for part in parts if not _is_union_tag(part))


def _describe_one(error: Mapping[str, Any]) -> tuple[str, str]:
    if error.get("type") == "json_invalid":
        reason = (error.get("ctx") or {}).get("error", "")
        return "", f"the request body is not valid JSON{': ' if reason else ''}{reason}"
    path = field_path(error.get("loc", ()))
    message = str(error.get("msg", "invalid value"))
    for prefix in _NOISE_PREFIXES:
        message = message.removeprefix(prefix)
    return path, message


def describe_validation_error(
    error: ValidationError | Sequence[Mapping[str, Any]],
) -> ValidationProblem:
    """One message for all of a request's errors (pydantic's, or FastAPI's `exc.errors()`), each
    prefixed by its field path; `param` is the first error's path, or None for the whole body."""
    errors = error.errors() if isinstance(error, ValidationError) else list(error)
    if not errors:
        return ValidationProblem("invalid request", None, "invalid_request")
    described: list[tuple[str, str]] = []
    for item in errors:
        one = _describe_one(item)
        if one not in described:  # union branches often repeat the same complaint
            described.append(one)
    lines = [f"{path}: {message}" if path else message for path, message in described]
    message = "; ".join(lines[:MAX_LISTED_ERRORS])
    if len(lines) > MAX_LISTED_ERRORS:
        message += f" (and {len(lines) - MAX_LISTED_ERRORS} more)"
    first_path = described[0][0]
    return ValidationProblem(message, first_path or None, str(errors[0].get("type", "")))


def request_error_from_validation(
    error: ValidationError | Sequence[Mapping[str, Any]],
) -> InvalidRequestError:
    """The `ServingError` a 400 is built from: invalid UTF-8 and empty inputs keep their codes."""
    problem = describe_validation_error(error)
    error_class = _ERROR_CLASS_BY_TYPE.get(problem.error_type, InvalidRequestError)
    return error_class(problem.message, param=problem.param)
