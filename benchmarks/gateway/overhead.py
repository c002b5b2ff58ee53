"""The router's own time, measured: warm embedding requests one at a time, each with a text of its
own (a cache hit calls no model, and only a response that reached a model carries the header),
and the `x-edge-overhead-ms` each answer starts with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import httpx

from benchmarks.lib.corpus import benchmark_sentences
from benchmarks.lib.http_load import BadResponseError, Clock
from edgectl.loadtest.summary import latency_stats, latency_stats_s

OVERHEAD_HEADER = "x-edge-overhead-ms"


def inputs(count: int, run_id: str) -> list[str]:
    """`count` sentences, each made unique to this run."""
    return [f"{text} ({run_id} {index})" for index, text in enumerate(benchmark_sentences(count))]


async def one_by_one(
    client: httpx.AsyncClient,
    url: str,
    headers: Mapping[str, str],
    model: str,
    texts: Sequence[str],
    clock: Clock,
) -> tuple[list[float | None], list[float]]:
    """Per request: its x-edge-overhead-ms (None where absent) and its latency in seconds."""
    overheads: list[float | None] = []
    latencies: list[float] = []
    for text in texts:
        started = clock()
        response = await client.post(
            url, json={"model": model, "input": text}, headers=dict(headers)
        )
        latencies.append(clock() - started)
        if response.status_code != 200:
            raise BadResponseError(
                f"POST {url}: {response.status_code} {response.text[:300]}", response.status_code
            )
        header = response.headers.get(OVERHEAD_HEADER)
        overheads.append(None if header is None else float(header))
    return overheads, latencies


def summarise(overheads: Sequence[float | None], latencies: Sequence[float]) -> dict[str, Any]:
    return {
        "requests": len(overheads),
        "without_header": sum(1 for value in overheads if value is None),
        "overhead_ms": latency_stats(overheads),
        "latency_ms": latency_stats_s(latencies),
    }
