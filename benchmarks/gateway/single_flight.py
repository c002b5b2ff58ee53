"""Single flight, measured: identical cacheable chat requests sent at once; the answers, their
latencies and each one's `x-edge-cache` (MISS: the one that called the model; JOINED: waited for
it; HIT: found it stored)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.lib.http_load import Clock
from edgectl.loadtest.summary import latency_stats_s

CACHE_HEADER = "x-edge-cache"
WAITED = ("JOINED", "HIT")  # answered without a model call of their own


@dataclass(frozen=True)
class Answer:
    latency_s: float
    status: int
    cache: str | None  # x-edge-cache, upper case
    choices: str | None  # the answer's choices as JSON, to compare (None: no answer)


async def identical_at_once(
    client: httpx.AsyncClient,
    url: str,
    headers: Mapping[str, str],
    body: dict[str, Any],
    count: int,
    clock: Clock,
) -> list[Answer]:
    """`count` copies of `body`, released together once every task waits at the start line."""
    start = asyncio.Event()

    async def one() -> Answer:
        await start.wait()
        started = clock()
        response = await client.post(url, json=body, headers=dict(headers))
        elapsed = clock() - started
        choices = None
        if response.status_code == 200:
            choices = json.dumps(response.json().get("choices"), sort_keys=True)
        cache = response.headers.get(CACHE_HEADER)
        return Answer(elapsed, response.status_code, cache and cache.upper(), choices)

    tasks = [asyncio.create_task(one()) for _ in range(count)]
    await asyncio.sleep(0)  # every task reaches the start line
    start.set()
    return list(await asyncio.gather(*tasks))


def summarise(answers: Sequence[Answer], model_calls: float | None) -> dict[str, Any]:
    """What the burst cost and how long each side waited: the first (the MISS that called the
    model; the fastest, if several did) against the waiters (JOINED or HIT)."""
    misses = [a.latency_s for a in answers if a.cache == "MISS"]
    waiters = [a.latency_s for a in answers if a.cache in WAITED]
    first_ms = round(min(misses) * 1000, 3) if misses else None
    waiters_ms = latency_stats_s(waiters)
    over = None
    if first_ms is not None and waiters_ms["p50"] is not None:
        over = round(waiters_ms["p50"] - first_ms, 3)
    return {
        "requests": len(answers),
        "statuses": _counts(str(a.status) for a in answers),
        "cache": _counts(a.cache or "none" for a in answers),
        "model_calls_counted": model_calls,
        "distinct_answers": len({a.choices for a in answers if a.choices is not None}),
        "answered": sum(1 for a in answers if a.choices is not None),
        "first_ms": first_ms,
        "waiters_ms": waiters_ms,
        "waiters_p50_over_first_ms": over,
    }


def _counts(values: Any) -> dict[str, int]:
    return dict(sorted(Counter(values).items()))
