"""Retry-After, trusted or not: a model at zero replicas asked with Workers AI's `rejectIfBusy`
answers 429 with `retry-after-ms`, its estimate of when a replica is up. A `retry` try sends the
same request again exactly then (one retry, no second chance); a `poll` try instead sends it
every `interval_s` from the refusal on and keeps when the first one that succeeded was sent:
when the model was actually ready. The two kinds alternate, each from zero again."""

from __future__ import annotations

import asyncio
import statistics
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import httpx

from benchmarks.lib.http_load import Clock
from edgectl.loadtest.summary import latency_stats_s

Kind = Literal["retry", "poll"]
BUSY = 429


@dataclass(frozen=True)
class Refusal:
    status: int  # 429 expected; 200: the model took it at once (the router saw it warm)
    estimate_s: float | None  # retry-after-ms (or Retry-After) in seconds
    received_at: float  # the clock when the answer was read


@dataclass(frozen=True)
class RetryTry:
    kind: Kind
    to_zero_s: float | None  # until Serve showed no replica of the model (None: timed out)
    status: int  # the first request's
    estimate_s: float | None
    retry_status: int | None = None  # retry: the retry's status at the estimate
    ready_s: float | None = None  # poll: refusal to the send of the first poll answered


def kinds(retries: int, polls: int) -> list[Kind]:
    """The tries' order: retry and poll alternating while both last, the rest after."""
    order: list[Kind] = []
    for index in range(max(retries, polls)):
        if index < retries:
            order.append("retry")
        if index < polls:
            order.append("poll")
    return order


def estimate_s(headers: Mapping[str, str]) -> float | None:
    """retry-after-ms in seconds, else Retry-After's whole seconds; None without either."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return float(value) / scale
            except ValueError:
                continue
    return None


@dataclass(frozen=True)
class BusyCaller:
    """One model's rejectIfBusy request, never served from the cache."""

    url: str
    headers: Mapping[str, str]
    body: dict[str, Any]

    async def send(self, client: httpx.AsyncClient, clock: Clock) -> Refusal:
        response = await client.post(self.url, json=self.body, headers=dict(self.headers))
        return Refusal(response.status_code, estimate_s(response.headers), clock())


async def one_try(
    client: httpx.AsyncClient,
    caller: BusyCaller,
    kind: Kind,
    wait_for_zero: Callable[[], Awaitable[float | None]],
    interval_s: float,
    ready_timeout_s: float,
    clock: Clock,
) -> RetryTry:
    to_zero_s = await wait_for_zero()
    first = await caller.send(client, clock)
    if first.status != BUSY or first.estimate_s is None:
        return RetryTry(kind, to_zero_s, first.status, first.estimate_s)
    if kind == "retry":
        await asyncio.sleep(max(0.0, first.received_at + first.estimate_s - clock()))
        retry = await caller.send(client, clock)
        return RetryTry(kind, to_zero_s, first.status, first.estimate_s, retry_status=retry.status)
    ready_at = await first_answered(client, caller, interval_s, ready_timeout_s, clock)
    ready_s = None if ready_at is None else round(ready_at - first.received_at, 4)
    return RetryTry(kind, to_zero_s, first.status, first.estimate_s, ready_s=ready_s)


async def first_answered(
    client: httpx.AsyncClient, caller: BusyCaller, interval_s: float, timeout_s: float, clock: Clock
) -> float | None:
    """The send time of the earliest poll answered 200: a poll leaves every `interval_s`
    whether or not the one before has come back, until one succeeds (or `timeout_s`)."""
    answered: list[float] = []

    async def poll() -> None:
        sent = clock()
        try:
            if (await caller.send(client, clock)).status == 200:
                answered.append(sent)
        except httpx.HTTPError:
            pass  # a poll that failed says nothing about readiness

    deadline = clock() + timeout_s
    polls: list[asyncio.Task[None]] = []
    while not answered and clock() < deadline:
        polls.append(asyncio.create_task(poll()))
        await asyncio.sleep(interval_s)
    await asyncio.gather(*polls)  # one sent earlier may still succeed
    return min(answered, default=None)


def summarise(tries: Sequence[RetryTry]) -> dict[str, Any]:
    """The refusals' estimates, the retries' outcome and the pollers' ready times."""
    refused = [t for t in tries if t.status == BUSY and t.estimate_s is not None]
    retries = [t for t in refused if t.kind == "retry"]
    polls = [t for t in refused if t.kind == "poll"]
    ready = [t.ready_s for t in polls if t.ready_s is not None]
    estimates = [t.estimate_s for t in refused if t.estimate_s is not None]
    succeeded = sum(1 for t in retries if t.retry_status == 200)
    return {
        "tries": len(tries),
        "refused_with_estimate": len(refused),
        "not_refused": _counts(str(t.status) for t in tries if t not in refused),
        "retries": len(retries),
        "first_retry_succeeded": succeeded,
        "first_retry_success_share": round(succeeded / len(retries), 3) if retries else None,
        "retry_statuses": _counts(str(t.retry_status) for t in retries),
        "estimate_ms": latency_stats_s(estimates),
        "estimate_median_s": round(statistics.median(estimates), 4) if estimates else None,
        # The goal says "never more than": the largest estimate is the one judged.
        "estimate_max_s": round(max(estimates), 4) if estimates else None,
        "polls": len(polls),
        "polls_never_answered": sum(1 for t in polls if t.ready_s is None),
        "ready_ms": latency_stats_s(ready),
        "ready_median_s": round(statistics.median(ready), 4) if ready else None,
        "per_try": [asdict(t) for t in tries],
    }


def _counts(values: Iterable[str]) -> dict[str, int]:
    return dict(sorted(Counter(values).items()))
