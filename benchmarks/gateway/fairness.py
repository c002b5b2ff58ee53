"""Fairness between keys, measured: key A floods a chat model with long streams from many
clients at once (each sending again as soon as one ends, after the Retry-After of a refusal),
while key B sends one short stream at a time from a process of its own (light_client.py); each
stream's status, Retry-After and time to first token. B alone first, in the same run, gives its
own baseline."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.lib.http_load import BadResponseError, Clock, timed_chat_stream
from edgectl.loadtest.summary import latency_stats_s

REFUSALS = (429, 503)  # the gateway's capacity answers, each with a Retry-After
NO_STATUS = 0  # a stream that failed without an HTTP status (cut, or the connection lost)
DEFAULT_BACKOFF_S = 1.0  # a refusal without a Retry-After: the flood waits this long
DRAIN_S = 60.0  # once B is done, the flood's streams in flight may end this long
LIGHT_CLIENT = "benchmarks.gateway.light_client"  # B's process: `python -m` of this module
REPO_ROOT = Path(__file__).resolve().parents[2]  # where that `python -m` finds this very package


@dataclass(frozen=True)
class StreamOutcome:
    status: int  # 200, the refusal's status, or NO_STATUS
    ttft_s: float | None = None
    tokens: int | None = None
    retry_after: str | None = None  # a refusal's Retry-After header


@dataclass(frozen=True)
class Caller:
    """Where one key's streams go and what they ask for."""

    url: str
    headers: Mapping[str, str]
    body: dict[str, Any]


async def one_stream(client: httpx.AsyncClient, caller: Caller, clock: Clock) -> StreamOutcome:
    try:
        timing = await timed_chat_stream(client, caller.url, caller.body, clock, caller.headers)
    except BadResponseError as refused:
        return StreamOutcome(
            refused.status_code or NO_STATUS, retry_after=refused.headers.get("retry-after")
        )
    except httpx.HTTPError:
        return StreamOutcome(NO_STATUS)
    return StreamOutcome(200, timing.ttft_s, timing.completion_tokens)


async def one_at_a_time(
    client: httpx.AsyncClient, caller: Caller, count: int, gap_s: float, clock: Clock
) -> list[StreamOutcome]:
    outcomes = []
    for _ in range(count):
        outcomes.append(await one_stream(client, caller, clock))
        await asyncio.sleep(gap_s)
    return outcomes


async def one_at_a_time_apart(caller: Caller, count: int, gap_s: float) -> list[StreamOutcome]:
    """`one_at_a_time` in a process of its own (`python -m benchmarks.gateway.light_client`),
    with its own event loop and HTTP client, as a real client of another key is. Read by this
    process's event loop, B's first chunk would wait while that loop parses A's thousands of SSE
    chunks, and B's time to first token would be mostly that lag (a diagnostic measured B's p50
    at 1,007 ms here against 210 ms from a process of its own). The child times with the same
    reader (`timed_chat_stream`), so its figures compare with the other suites'. Its start-up
    (imports) comes before its first stream is sent: untimed, it only lengthens a flood's ramp."""
    request = {"caller": dataclasses.asdict(caller), "count": count, "gap_s": gap_s}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        LIGHT_CLIENT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        cwd=REPO_ROOT,
    )  # its stderr is ours: a traceback lands in the suite's log
    try:
        answer, _ = await process.communicate(json.dumps(request).encode())
    finally:
        if process.returncode is None:  # cancelled: no orphan goes on sending B's streams
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"{LIGHT_CLIENT} exited with {process.returncode}")
    return [StreamOutcome(**outcome) for outcome in json.loads(answer)]


async def flood_beside(
    client: httpx.AsyncClient,
    flood: Caller,
    flood_clients: int,
    ramp_s: float,
    light: Caller,
    light_count: int,
    gap_s: float,
    clock: Clock,
) -> tuple[list[StreamOutcome], list[StreamOutcome]]:
    """`flood_clients` loops of A's streams in this process; after `ramp_s`, B's `light_count`
    streams one at a time from a process of its own (`one_at_a_time_apart`); then the flood stops
    sending and its streams in flight end (or are cut after DRAIN_S). Returns (A's outcomes,
    B's)."""
    stop = asyncio.Event()
    flooded: list[StreamOutcome] = []

    async def flood_client() -> None:
        while not stop.is_set():
            outcome = await one_stream(client, flood, clock)
            flooded.append(outcome)
            if outcome.status != 200:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff_s(outcome.retry_after))

    loops = [asyncio.create_task(flood_client()) for _ in range(flood_clients)]
    try:
        await asyncio.sleep(ramp_s)
        lightly = await one_at_a_time_apart(light, light_count, gap_s)
    finally:
        stop.set()
        _, cut = await asyncio.wait(loops, timeout=DRAIN_S)
        for loop in cut:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
    return flooded, lightly


def backoff_s(retry_after: str | None) -> float:
    """A refused client's wait: its Retry-After (seconds), or DEFAULT_BACKOFF_S without one."""
    try:
        return max(0.0, float(retry_after)) if retry_after is not None else DEFAULT_BACKOFF_S
    except ValueError:
        return DEFAULT_BACKOFF_S


def summarise(outcomes: Sequence[StreamOutcome]) -> dict[str, Any]:
    """One key's streams: how many, by status, the refusals (and those without a Retry-After),
    time to first token of those answered, and their mean length."""
    answered = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status != 200]
    tokens = [o.tokens for o in answered if o.tokens is not None]
    return {
        "streams": len(outcomes),
        "statuses": dict(sorted(Counter(str(o.status) for o in outcomes).items())),
        "refused": len(refused),
        "refused_without_retry_after": sum(
            1 for o in refused if o.status in REFUSALS and o.retry_after is None
        ),
        "failed_without_status": sum(1 for o in refused if o.status == NO_STATUS),
        "ttft_ms": latency_stats_s(o.ttft_s for o in answered),
        "mean_completion_tokens": round(sum(tokens) / len(tokens), 1) if tokens else None,
    }
