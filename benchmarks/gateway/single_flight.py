"""Single flight, measured: bursts of identical cacheable chat requests sent at once, each burst
a request of its own; the answers, their latencies and each one's `x-edge-cache` (MISS: the one
that called the model; JOINED: waited for it; HIT: found it stored). The requests go out on a
bare client (`raw_http`) so that what is timed is the gateway's answer, not the client's own
parsing of 31 answers landing together."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.lib.http_load import Clock
from benchmarks.lib.raw_http import RawConnection, encode
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
    url: str,
    headers: Mapping[str, str],
    body: dict[str, Any],
    count: int,
    clock: Clock,
    warm_url: str,
) -> list[Answer]:
    """`count` copies of `body`, each on a keep-alive connection of its own that a GET of
    `warm_url` used first (as a client's warm pool is), written together once every task waits
    at the start line; each timed from its first byte written to its answer's last read."""
    connections = await asyncio.gather(*(RawConnection.open(url) for _ in range(count)))
    try:
        warm = encode("GET", warm_url, headers)
        await asyncio.gather(*(connection.exchange(warm, clock) for connection in connections))
        request = encode("POST", url, headers, body)
        start = asyncio.Event()

        async def one(connection: RawConnection) -> Answer:
            await start.wait()
            response = await connection.exchange(request, clock)
            choices = None
            if response.status == 200:
                choices = json.dumps(response.json().get("choices"), sort_keys=True)
            cache = response.headers.get(CACHE_HEADER)
            return Answer(response.latency_s, response.status, cache and cache.upper(), choices)

        tasks = [asyncio.create_task(one(connection)) for connection in connections]
        await asyncio.sleep(0)  # every task reaches the start line
        start.set()
        return list(await asyncio.gather(*tasks))
    finally:
        await asyncio.gather(*(connection.close() for connection in connections))


def summarise(answers: Sequence[Answer]) -> dict[str, Any]:
    """One burst: how long each side waited, the first (the MISS that called the model; the
    fastest, if several did) against the waiters (JOINED or HIT)."""
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
        "distinct_answers": len({a.choices for a in answers if a.choices is not None}),
        "answered": sum(1 for a in answers if a.choices is not None),
        "first_ms": first_ms,
        "waiters_ms": waiters_ms,
        "waiters_p50_over_first_ms": over,
    }


def summarise_bursts(
    bursts: Sequence[Sequence[Answer]], model_calls: float | None
) -> dict[str, Any]:
    """The bursts together: `model_calls` counted over all of them, the most distinct answers in
    one burst, and each burst's waiters' p50 past its first (judged on their median)."""
    each = [summarise(answers) for answers in bursts]
    answers = [answer for burst in bursts for answer in burst]
    return {
        "bursts": len(each),
        "requests": len(answers),
        "statuses": _counts(str(a.status) for a in answers),
        "cache": _counts(a.cache or "none" for a in answers),
        "model_calls_counted": model_calls,
        "distinct_answers": max((b["distinct_answers"] for b in each), default=0),
        "answered": sum(b["answered"] for b in each),
        "first_ms": [b["first_ms"] for b in each],
        "waiters_p50_ms": [b["waiters_ms"]["p50"] for b in each],
        "waiters_p50_over_first_ms": [b["waiters_p50_over_first_ms"] for b in each],
    }


def _counts(values: Any) -> dict[str, int]:
    return dict(sorted(Counter(values).items()))
