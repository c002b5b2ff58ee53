"""Client-side load for the served suites: waiting for a route to answer, timed HTTP requests
(interleaved sequential, concurrent), closed-loop throughput of any async call, timed SSE chat
streams; latencies summarised by the load tester's `latency_stats_s`."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource

from edgectl.loadtest.responses import StreamTally
from edgectl.loadtest.summary import latency_stats_s

Clock = Callable[[], float]
Send = Callable[[int], Awaitable[Any]]

NOT_READY_STATUSES = (404, 503)  # no route yet, no replica yet


class BadResponseError(RuntimeError):
    """A benchmark request that did not succeed: the numbers would be about errors, not work."""

    def __init__(
        self,
        message: str,
        status_code: int | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.status_code = status_code
        # The refusal's headers (Retry-After among them), names in lower case.
        self.headers = {name.lower(): value for name, value in (headers or {}).items()}


@dataclass(frozen=True)
class Endpoint:
    """Where a request goes, and the headers that come with it."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)


def async_client(connections: int, timeout_s: float = 120.0) -> httpx.AsyncClient:
    # Enough pooled keep-alive connections that no client waits for a socket.
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(limits=limits, timeout=timeout_s)


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


async def ready(
    client: httpx.AsyncClient, endpoint: Endpoint, body: dict[str, Any], timeout_s: float = 300
) -> dict[str, Any]:
    """The first 200's JSON body. The proxy learns new routes a moment after an application runs
    and a replica may still be starting: retry while it answers 404 or 503; any other failure is
    a bug to report at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = await client.post(endpoint.url, json=body, headers=dict(endpoint.headers))
            if response.status_code == 200:
                return dict(response.json())
            if response.status_code not in NOT_READY_STATUSES or time.monotonic() > deadline:
                raise BadResponseError(
                    f"POST {endpoint.url}: {response.status_code} {response.text[:300]}",
                    response.status_code,
                )
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


async def post_json(
    client: httpx.AsyncClient, endpoint: Endpoint, body: dict[str, Any]
) -> dict[str, Any]:
    """One request's JSON answer; a non-200 answer is an error, not a sample."""
    response = await client.post(endpoint.url, json=body, headers=dict(endpoint.headers))
    if response.status_code != 200:
        raise BadResponseError(
            f"POST {endpoint.url}: {response.status_code} {response.text[:300]}",
            response.status_code,
        )
    return dict(response.json())


def rotated(names: Sequence[str], round_index: int) -> list[str]:
    """`names` starting at round_index: in interleaved rounds no side always goes first, so load
    from whatever else shares the machine lands on every side alike."""
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


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
    for round_index in range(rounds):
        # Rotate the start too: no target always follows the same one.
        for name in rotated(sorted(endpoints), round_index):
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
        "latency_ms": latency_stats_s(latencies),
    }


@dataclass(frozen=True)
class StreamTiming:
    """One chat stream, timed from the moment the request was sent."""

    ttft_s: float  # first chunk that carries text
    total_s: float  # until the stream ended
    completion_tokens: int
    started_s: float = 0.0  # the clock when it was sent
    content_at_s: tuple[float, ...] = ()  # each chunk with text, from started_s

    @property
    def tokens_per_s(self) -> float:
        """Over the whole stream: text released in bursts (moderation windows) makes a rate
        after the first token meaningless."""
        return self.completion_tokens / self.total_s


async def timed_chat_stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    clock: Clock,
    headers: Mapping[str, str] | None = None,
) -> StreamTiming:
    """Send one `stream: true` chat request (with include_usage) and time its chunks, read by the
    load tester's SSE reader (one reader of our streams for benchmarks and load tests)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    started = clock()
    tally = StreamTally()
    async with client.stream("POST", url, json=body, headers=dict(headers or {})) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise BadResponseError(
                f"POST {url}: {response.status_code} {text[:300]}",
                response.status_code,
                response.headers,
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
    return StreamTiming(
        tally.first_token_s,
        clock() - started,
        tally.usage_tokens,
        started,
        tuple(tally.content_at_s),
    )


async def completion_tokens_at_once(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    bodies: Sequence[dict[str, Any]],
    clock: Clock,
) -> tuple[float, int]:
    """Every body sent at once as a whole-answer request: (wall seconds until the last answer,
    completion tokens over all of them)."""
    started = clock()
    answers = await asyncio.gather(*(post_json(client, endpoint, body) for body in bodies))
    return clock() - started, sum(a["usage"]["completion_tokens"] for a in answers)
