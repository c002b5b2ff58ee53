"""JSON bodies, encoded once: our answers are already validated models, so routes return them as
responses directly instead of letting FastAPI validate them again."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel

log = logging.getLogger("ray.serve")


def jsonable(value: Any) -> Any:
    """A response model (or plain data holding some) as JSON-ready data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", by_alias=True)
    if isinstance(value, list):
        return [jsonable(item) for item in value]
    return value


def json_response(
    body: Any, headers: Mapping[str, str] | None = None, status: int = 200
) -> JSONResponse:
    return JSONResponse(jsonable(body), status_code=status, headers=dict(headers or {}))


def json_text(body: Any) -> str:
    """One SSE event's data, encoded as JSONResponse would encode it."""
    return json.dumps(jsonable(body), ensure_ascii=False, allow_nan=False, separators=(",", ":"))


IGNORED_FIELDS_HEADER = "x-ignored-fields"


def ignored_fields_header(body: Any) -> dict[str, str]:
    """Fields of the request OpenAI does not define, which we accepted and did not use: named
    in a response header (and the log), never dropped silently."""
    ignored = body.ignored_fields() if hasattr(body, "ignored_fields") else []
    if not ignored:
        return {}
    log.info("ignored request fields: %s", ", ".join(ignored))
    return {IGNORED_FIELDS_HEADER: ", ".join(ignored)}
