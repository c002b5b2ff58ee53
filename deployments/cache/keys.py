"""What a cached answer is filed under, and whether a client asked to skip the cache.

Keys hash the model, the endpoint, the validated request (so field order and ignored fields do
not matter) and the caller's credentials: one API key never sees another's cached answers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from pydantic import BaseModel

BYPASS_VALUES = {"bypass", "no-cache", "no-store"}


def wants_bypass(headers: Mapping[str, str]) -> bool:
    """`x-edge-cache: bypass` or `cache-control: no-cache|no-store` skips the cache."""
    if headers.get("x-edge-cache", "").lower() in BYPASS_VALUES:
        return True
    directives = {d.strip().lower() for d in headers.get("cache-control", "").split(",")}
    return bool(directives & BYPASS_VALUES)


def cache_key(endpoint: str, request: BaseModel, credentials: str | None) -> str:
    body = request.model_dump(mode="json", exclude={"stream", "stream_options", "user"})
    material = json.dumps(
        {
            "endpoint": endpoint,
            "request": body,
            "credentials": hashlib.sha256((credentials or "").encode()).hexdigest(),
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(material.encode()).hexdigest()
