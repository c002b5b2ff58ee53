"""A model's cold start from zero, as a user's next request meets it: the at-rest suite's second
part (the embedding model) and the at-size suite's (the at-size GLM). Cycle after cycle: wait
until Serve shows every pool of the model at zero, then until `cold_interval_s` since the previous
request (never longer: the warm pool must be ready again by then, or the miss must be cheap), then
one request through the HTTP port (`ColdRequest`), timed by the client to the whole response,
with the router's cold-start headers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import httpx
import numpy as np

from benchmarks.atrest.config import ColdCycleSettings
from benchmarks.lib.goals import GoalRecord, goal

log = logging.getLogger(__name__)

COLD_MODEL = "embedding"
EMBEDDINGS_PATH = "/v1/embeddings"
# How often Serve's replicas are read while waiting for zero: a request sent at most this late
# after the pools reached zero, and the dashboard asked twice a second, no more.
ZERO_POLL_S = 0.5
# Issue "Cold starts without a tail": the embedding model from zero, a cycle every ~10 s.
COLD_START_P50_TARGET_S = 0.5
COLD_START_P90_TARGET_S = 0.75
COLD_START_HEADER = "x-edge-cold-start"
COLD_START_MS_HEADER = "x-edge-cold-start-ms"


@dataclass(frozen=True)
class ColdRequest:
    """What a cycle sends: `body(text)` carries `text`, unique per request, so no cache answers."""

    model: str
    path: str
    body: Callable[[str], dict[str, Any]]


EMBEDDING_REQUEST = ColdRequest(
    COLD_MODEL, EMBEDDINGS_PATH, lambda text: {"model": COLD_MODEL, "input": text}
)


def chat_request(model: str) -> ColdRequest:
    """One token of a chat answer: the time to it is the cold start's."""
    return ColdRequest(
        model,
        "/v1/chat/completions",
        lambda text: {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 1,
        },
    )


class Clock(Protocol):
    """Seconds on one monotonic timeline, and waiting on it (a fake one in tests)."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass(frozen=True)
class Answer:
    """One timed request: seconds from send to the whole response read, status, headers."""

    seconds: float
    status: int | None  # None: no response (the connection failed or timed out)
    cold_start: str | None = None  # x-edge-cold-start: "1" when the request waited for one
    cold_start_ms: float | None = None  # x-edge-cold-start-ms
    error: str | None = None


@dataclass(frozen=True)
class ColdCycle:
    cycle: int
    zero_after_s: float | None  # from the previous request's send to the pools seen at zero
    since_previous_request_s: float | None  # None: nothing sent (the pools never reached zero)
    answer: Answer | None

    @property
    def answered_s(self) -> float | None:
        """The timed seconds of an answered (200) request from zero; None otherwise."""
        if self.answer is None or self.answer.status != 200:
            return None
        return self.answer.seconds


class ColdCycles:
    """The requests and the waits between them. `at_zero`: whether Serve shows no replica of
    any of the model's pools (starting and stopping ones count as up)."""

    def __init__(
        self,
        client: httpx.Client,
        base_url: str,
        at_zero: Callable[[], bool],
        clock: Clock,
        run_id: str,
        request: ColdRequest = EMBEDDING_REQUEST,
    ):
        self.client = client
        self.cold_request = request
        self.url = f"{base_url}{request.path}"
        self.at_zero = at_zero
        self.clock = clock
        self.run_id = run_id  # in every input: nothing this run sends is in a cache already

    def run(self, config: ColdCycleSettings) -> dict[str, Any]:
        """A first request from the rested platform sets the pace (reported apart, outside the
        goals: the cycles are a user's next requests, not a rested platform's first), then
        `config.cold_cycles` cycles."""
        previous_sent = self.clock.now()
        rested = self.request("rested")
        cycles = []
        for index in range(1, config.cold_cycles + 1):
            cycle, sent = self.cycle(index, previous_sent, config)
            cycles.append(cycle)
            previous_sent = sent if sent is not None else previous_sent
        return summarise(rested, cycles)

    def cycle(
        self, index: int, previous_sent: float, config: ColdCycleSettings
    ) -> tuple[ColdCycle, float | None]:
        """Zero, then the pace; nothing sent if the pools are still up a margin past their
        idle delay (the request would not be a cold start)."""
        zero_within_s = config.cold_idle_delay_s + config.zero_margin_s
        zero_after_s = self.wait_for_zero(previous_sent, zero_within_s)
        if zero_after_s is None:
            log.warning(
                "cold cycle %d: the %s pools not at zero, nothing sent",
                index,
                self.cold_request.model,
            )
            return ColdCycle(index, None, None, None), None
        self.clock.sleep(max(0.0, previous_sent + config.cold_interval_s - self.clock.now()))
        sent = self.clock.now()
        answer = self.request(f"cycle {index}")
        log.info(
            "cold cycle %d: %.3f s (status %s, %s=%s, %s=%s), at zero after %.1f s",
            index,
            answer.seconds,
            answer.status,
            COLD_START_HEADER,
            answer.cold_start,
            COLD_START_MS_HEADER,
            answer.cold_start_ms,
            zero_after_s,
        )
        return ColdCycle(index, zero_after_s, round(sent - previous_sent, 3), answer), sent

    def wait_for_zero(self, since: float, within_s: float) -> float | None:
        """Seconds from `since` until the pools are seen at zero; None past `within_s`."""
        while not self.at_zero():
            if self.clock.now() - since > within_s:
                return None
            self.clock.sleep(ZERO_POLL_S)
        return round(self.clock.now() - since, 3)

    def request(self, label: str) -> Answer:
        body = self.cold_request.body(f"cold start {self.run_id} {label}")
        started = self.clock.now()
        try:
            response = self.client.post(self.url, json=body)
        except httpx.HTTPError as error:
            return Answer(round(self.clock.now() - started, 4), None, error=repr(error))
        seconds = round(self.clock.now() - started, 4)
        cold_ms = response.headers.get(COLD_START_MS_HEADER)
        return Answer(
            seconds,
            response.status_code,
            response.headers.get(COLD_START_HEADER),
            None if cold_ms is None else float(cold_ms),
            None if response.status_code == 200 else response.text[:300],
        )


def summarise(rested: Answer, cycles: Sequence[ColdCycle]) -> dict[str, Any]:
    """Per cycle its figures, and p50/p90 of the answered ones (numpy's linear percentiles)."""
    answered = [s for c in cycles if (s := c.answered_s) is not None]
    p50 = p90 = None
    if answered:
        p50, p90 = (round(float(p), 4) for p in np.percentile(answered, (50, 90)))
    return {
        "rested_request": asdict(rested),
        "cycles": [{**asdict(c), "answered_s": c.answered_s} for c in cycles],
        "answered": len(answered),
        "p50_s": p50,
        "p90_s": p90,
    }


def goals(summary: Mapping[str, Any]) -> dict[str, GoalRecord]:
    """The embedding model's p50 and p90 over the cycles."""
    note = (
        "client-side seconds to the whole POST /v1/embeddings response, the embedding pools at "
        "zero, each request ~cold_interval_s after the one before"
    )
    return {
        f"{COLD_MODEL}_cold_start_{name}_s": percentile_goal(summary, name, target, note)
        for name, target in (("p50", COLD_START_P50_TARGET_S), ("p90", COLD_START_P90_TARGET_S))
    }


def percentile_goal(
    summary: Mapping[str, Any], name: str, target_s: float, note: str
) -> GoalRecord:
    """`summary`'s `name` ("p50" or "p90") at most `target_s`. A cycle unanswered (or never at
    zero) leaves it unmeasured, since dropping it would flatter the tail the goal is about."""
    cycles = summary.get("cycles", [])
    missing = summary.get("error") or (
        f"{summary.get('answered', 0)} of {len(cycles)} cycles answered from zero"
    )
    complete = "error" not in summary and summary["answered"] == len(cycles) > 0
    return goal(
        summary.get(f"{name}_s") if complete else None,
        target_s,
        "s",
        at_most=True,
        missing=missing,
        note=note,
        details={"per_cycle_s": [c["answered_s"] for c in cycles]},
    )
