"""Client-side load for the serving benchmarks: timed HTTP requests (interleaved sequential,
concurrent), closed-loop throughput of any async call, timed SSE chat streams, percentiles."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from httpx_sse import EventSource

from edgectl.loadtest.responses import StreamTally

Clock = Callable[[], float]
Send = Callable[[int], Awaitable[Any]]


class BadResponseError(RuntimeError):
    """A benchmark request that did not succeed: the numbers would be about errors, not work."""

    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


@dataclass(frozen=True)
class Endpoint:
    """Where a request goes, and the headers that come with it."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


def async_client(connections: int, timeout_s: float = 120.0) -> httpx.AsyncClient:
    # Enough pooled keep-alive connections that no client waits for a socket.
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(limits=limits, timeout=timeout_s)


def latency_summary(latencies_s: Sequence[float]) -> dict[str, Any]:
    samples_ms = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    p50, p99 = np.percentile(samples_ms, [50, 99])
    return {
        "requests": int(samples_ms.size),
        "p50_ms": round(float(p50), 3),
        "p99_ms": round(float(p99), 3),
        "mean_ms": round(float(samples_ms.mean()), 3),
    }


async def timed_post(
    client: httpx.AsyncClient, endpoint: Endpoint, body: dict[str, Any], clock: Clock
) -> float:
    """Seconds from send to the whole response read; a non-200 answer is an error, not a sample."""
    started = clock()
    response = await client.post(endpoint.url, json=body, headers=dict(endpoint.headers))
    elapsed = clock() - started
    if response.status_code != 200:
        raise BadResponseError(
            f"POST {endpoint.url}: {response.status_code} {response.text[:300]}",
            response.status_code,
        )
    return elapsed


async def interleaved_latencies(
    client: httpx.AsyncClient,
    endpoints: Mapping[str, Endpoint],
    body: dict[str, Any],
    rounds: int,
    clock: Clock,
) -> dict[str, list[float]]:
    """One request at a time, rotating through the targets, so a burst of load from whatever
    else shares the machine lands on every target alike."""
    latencies: dict[str, list[float]] = {name: [] for name in endpoints}
    names = sorted(endpoints)
    for round_index in range(rounds):
        # Rotate the start too: no target always follows the same one.
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            latencies[name].append(await timed_post(client, endpoints[name], body, clock))
    return latencies


async def concurrent_latencies(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    body: dict[str, Any],
    clients: int,
    requests_per_client: int,
    clock: Clock,
) -> tuple[list[float], float]:
    """`clients` loops each sending `requests_per_client` requests back to back: the latencies
    and the wall time of the whole run."""

    async def one_client() -> list[float]:
        return [await timed_post(client, endpoint, body, clock) for _ in range(requests_per_client)]

    started = clock()
    per_client = await asyncio.gather(*(one_client() for _ in range(clients)))
    wall_s = clock() - started
    return [latency for latencies in per_client for latency in latencies], wall_s


async def closed_loop_throughput(
    send: Send,
    clients: int,
    warmup_s: float,
    measure_s: float,
    clock: Clock,
) -> dict[str, Any]:
    """`clients` loops each awaiting `send(n)` back to back (n numbers the requests); requests/s
    counts those that finished inside the measuring window (after `warmup_s`, for `measure_s`),
    so start-up ramps are left out."""
    started = clock()
    window_start, window_end = started + warmup_s, started + warmup_s + measure_s
    finished: list[float] = []
    latencies: list[float] = []
    sequence = itertools.count()  # one event loop: no two clients draw the same number

    async def one_client() -> None:
        while clock() < window_end:
            sent = clock()
            await send(next(sequence))
            now = clock()
            latency = now - sent
            if window_start <= now <= window_end:
                finished.append(now)
                latencies.append(latency)

    await asyncio.gather(*(one_client() for _ in range(clients)))
    return {
        "clients": clients,
        "requests_per_s": round(len(finished) / measure_s, 2),
        "window_s": measure_s,
        "latency": latency_summary(latencies) if latencies else None,
    }


@dataclass(frozen=True)
class StreamTiming:
    """One chat stream, timed from the moment the request was sent."""

    ttft_s: float  # first chunk that carries text
    total_s: float  # until the stream ended
    completion_tokens: int

    @property
    def tokens_per_s(self) -> float:
        """Over the whole stream: text released in bursts (moderation windows) makes a rate
        after the first token meaningless."""
        return self.completion_tokens / self.total_s


async def timed_chat_stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], clock: Clock
) -> StreamTiming:
    """Send one `stream: true` chat request (with include_usage) and time its chunks, read by the
    load tester's SSE reader (one reader of our streams for benchmarks and load tests)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    started = clock()
    tally = StreamTally()
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise BadResponseError(
                f"POST {url}: {response.status_code} {text[:300]}", response.status_code
            )
        async for event in EventSource(response).aiter_sse():
            tally.add(event, clock() - started)
            if tally.done or tally.error:
                break
    tally.finish()
    if tally.error is not None:
        raise BadResponseError(f"stream from {url}: {tally.error}")
    if tally.first_token_s is None or tally.usage_tokens is None:
        raise BadResponseError(f"stream from {url} ended without text or usage")
    return StreamTiming(tally.first_token_s, clock() - started, tally.usage_tokens)
