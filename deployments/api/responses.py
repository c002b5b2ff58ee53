"""JSON bodies, encoded once: our answers are already validated models, so routes return them as
responses directly instead of letting FastAPI validate them again."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel


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
