"""The router's exact-match response cache (AI-gateway style) for deterministic requests.

Keys hash the model, the endpoint, the validated request (so field order and ignored fields do
not matter) and the caller's credentials: one API key never sees another's cached answers.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from cachetools import TTLCache
from pydantic import BaseModel

from deployments.config import CacheConfig

BYPASS_VALUES = {"bypass", "no-cache", "no-store"}


def wants_bypass(headers: Mapping[str, str]) -> bool:
    """`x-edge-cache: bypass` or `cache-control: no-cache|no-store` skips the cache."""
    if headers.get("x-edge-cache", "").lower() in BYPASS_VALUES:
        return True
    directives = {d.strip().lower() for d in headers.get("cache-control", "").split(",")}
    return bool(directives & BYPASS_VALUES)


class ResponseCache:
    def __init__(self, config: CacheConfig, clock: Callable[[], float] = time.monotonic):
        self.enabled = config.enabled
        self._entries: TTLCache[str, Any] = TTLCache(
            maxsize=config.max_entries, ttl=config.ttl_s, timer=clock
        )

    @staticmethod
    def key(endpoint: str, request: BaseModel, credentials: str | None) -> str:
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

    def get(self, key: str) -> Any | None:
        return self._entries.get(key) if self.enabled else None

    def put(self, key: str, value: Any) -> None:
        if self.enabled:
            self._entries[key] = value

    def __len__(self) -> int:
        return len(self._entries)
