"""What the peers suite's measurements share: where the peers live, HTTP helpers, rounds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from benchmarks.http_load import Endpoint
from benchmarks.router import BYPASS_CACHE

Clock = Callable[[], float]

# (application, route prefix, deployment) of each peer, deployed beside the edge app.
PEER_EMBEDDING = ("peer-embedding", "/peer/embeddings", "DocsPatternEmbedder")
PEER_CHAT = ("peer-chat", "/peer/chat", "DocsPatternChat")


async def post_json(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(url, json=body, headers=BYPASS_CACHE)
    if response.status_code != 200:
        raise RuntimeError(f"POST {url}: {response.status_code} {response.text[:300]}")
    return response.json()


async def ready(
    client: httpx.AsyncClient, endpoint: Endpoint, body: dict[str, Any], timeout_s: float = 300
) -> dict[str, Any]:
    """The first 200 (a replica may still be starting: 404/503 until then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = await client.post(endpoint.url, json=body, headers=dict(endpoint.headers))
            if response.status_code == 200:
                return response.json()
            if response.status_code not in (404, 503) or time.monotonic() > deadline:
                raise RuntimeError(
                    f"POST {endpoint.url}: {response.status_code} {response.text[:300]}"
                )
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)
