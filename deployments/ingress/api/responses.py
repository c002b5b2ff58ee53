"""JSON bodies, encoded once and in one place, by orjson: our answers are already validated models
or plain data built from them, so routes return them as responses directly instead of letting
FastAPI validate them again, and numpy vectors are written as they are, never as one Python float
per dimension."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import numpy as np
import orjson
from starlette.responses import Response

from deployments.ingress.protocol import json_ready

# float32 arrays are written as the shortest text that reads back as the same float32.
OPTIONS = orjson.OPT_SERIALIZE_NUMPY

log = logging.getLogger("ray.serve")


def _default(value: Any) -> Any:
    """What orjson leaves to us: arrays it will not write as they are (a non-contiguous slice,
    an unsupported dtype) and numpy scalars of such dtypes."""
    if isinstance(value, np.ndarray):
        return np.ascontiguousarray(value).tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def encode_json(body: Any) -> bytes:
    """`body` (a response model, plain data holding some, numpy arrays) as compact UTF-8 JSON."""
    return orjson.dumps(json_ready(body), default=_default, option=OPTIONS)


class JSONBody(Response):
    """Starlette's JSONResponse, encoded by `encode_json`."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return encode_json(content)


def json_response(
    body: Any, headers: Mapping[str, str] | None = None, status: int = 200
) -> JSONBody:
    return JSONBody(body, status_code=status, headers=dict(headers or {}))


def json_text(body: Any) -> str:
    """One SSE event's data, encoded as `json_response` encodes a body."""
    return encode_json(body).decode()


IGNORED_FIELDS_HEADER = "x-ignored-fields"
MAX_NAMED_FIELDS = 20


def ignored_fields_header(body: Any) -> dict[str, str]:
    """Fields of the request OpenAI does not define, which we accepted and did not use: named
    in a response header (and the log), never dropped silently."""
    ignored = body.ignored_fields() if hasattr(body, "ignored_fields") else []
    if not ignored:
        return {}
    log.info("ignored request fields: %r", ignored)
    # A field name is client text: percent-encoded, it cannot break the header (a control
    # character would abort the response); a flood of names is cut, the log has them all.
    names = [quote(name, safe="-_.~[]@$") for name in ignored[:MAX_NAMED_FIELDS]]
    if len(ignored) > MAX_NAMED_FIELDS:
        names.append(f"... ({len(ignored) - MAX_NAMED_FIELDS} more)")
    return {IGNORED_FIELDS_HEADER: ", ".join(names)}
