"""The last few minutes of traffic as the live dashboard shows it: requests/s, p50/p99, errors
and route reasons per place (region, else colo) and model, plus cold starts as they happened.

Each router replica keeps its own `RecentTraffic`; their snapshots are plain JSON-ready values
that add up (counts and fixed latency buckets), so the dashboard shows the sum of all replicas.
Time comes from an injected clock."""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from deployments.observability.config import ModelPrice
from deployments.observability.metrics import cost_units
from deployments.observability.outcome import RequestOutcome

BUCKET_S = 5  # one row of counts per place and model every 5 s
WINDOW_S = 300  # what the page shows: the last 5 minutes
RATE_WINDOW_S = 60  # requests/s over the last minute
MAX_COLD_STARTS = 20
TOP_KEYS = 10
# Latency bucket bounds in seconds, ~12% apart from 1 ms to 5 min: a percentile is reported as
# its bucket's upper bound, so it is never more than 12% off.
LATENCY_BOUNDS_S: tuple[float, ...] = tuple(0.001 * 1.12**i for i in range(112))
NO_PLACE = "none"


def latency_bucket(seconds: float) -> int:
    return min(bisect.bisect_left(LATENCY_BOUNDS_S, seconds), len(LATENCY_BOUNDS_S) - 1)


@dataclass
class _Cell:
    """Counts of one place and model in one time bucket."""

    requests: int = 0
    errors: int = 0
    latency: dict[int, int] = field(default_factory=dict)  # bucket index -> count
    reasons: dict[str, int] = field(default_factory=dict)

    def add(self, outcome: RequestOutcome) -> None:
        self.requests += 1
        if outcome.status >= 500:
            self.errors += 1
        index = latency_bucket(outcome.latency_s)
        self.latency[index] = self.latency.get(index, 0) + 1
        if outcome.route_reason:
            self.reasons[outcome.route_reason] = self.reasons.get(outcome.route_reason, 0) + 1

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "latency": {str(k): v for k, v in self.latency.items()},
            "reasons": dict(self.reasons),
        }


class RecentTraffic:
    """Fed one `RequestOutcome` per finished request (the router's telemetry sink)."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.time,
        place_of: Callable[[RequestOutcome], str | None] | None = None,
        prices: Mapping[str, ModelPrice] | None = None,
    ):
        self._window_s = window_s
        self._clock = clock
        self._place_of = place_of or (lambda outcome: outcome.colo)
        self._prices = dict(prices or {})
        self._cells: dict[tuple[int, str, str], _Cell] = {}
        # Per authenticated key: requests, input tokens, output tokens, cost units.
        self._keys: dict[tuple[int, str], list[float]] = {}
        self._cold_starts: deque[dict[str, Any]] = deque(maxlen=MAX_COLD_STARTS)
        self.recorded = 0  # model requests recorded so far: a publisher's "anything new?"

    def record(self, outcome: RequestOutcome) -> None:
        if outcome.model is None or outcome.operation is None:
            return  # not a model request (catalogue, admin)
        self.recorded += 1
        now = self._clock()
        bucket = int(now // BUCKET_S) * BUCKET_S
        place = self._place_of(outcome) or NO_PLACE
        key = (bucket, place, outcome.model)
        cell = self._cells.get(key)
        if cell is None:
            cell = self._cells[key] = _Cell()
            self._forget_before(now - self._window_s)
        cell.add(outcome)
        if outcome.key_id is not None:
            usage = self._keys.setdefault((bucket, outcome.key_id), [0, 0, 0, 0.0])
            usage[0] += 1
            usage[1] += outcome.input_tokens or 0
            usage[2] += outcome.output_tokens or 0
            usage[3] += cost_units(outcome, self._prices)
        if outcome.cold_start_ms is not None:
            self._cold_starts.append(
                {
                    "at_unix": now,
                    "model": outcome.model,
                    "place": place,
                    "wait_s": outcome.cold_start_ms / 1000.0,
                    "phases": dict(outcome.cold_start_phases),
                }
            )

    def _forget_before(self, oldest: float) -> None:
        for key in [key for key in self._cells if key[0] + BUCKET_S <= oldest]:
            del self._cells[key]
        for usage_key in [k for k in self._keys if k[0] + BUCKET_S <= oldest]:
            del self._keys[usage_key]

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready and additive: what this replica saw in the window."""
        self._forget_before(self._clock() - self._window_s)
        return {
            "bucket_s": BUCKET_S,
            "cells": [
                [bucket, place, model, cell.as_json()]
                for (bucket, place, model), cell in sorted(self._cells.items())
            ],
            "keys": [[bucket, key_id, *usage] for (bucket, key_id), usage in self._keys.items()],
            "cold_starts": list(self._cold_starts),
        }


def _percentile(latency: Mapping[int, int], q: float) -> float | None:
    total = sum(latency.values())
    if not total:
        return None
    rank = math.ceil(q * total)
    seen = 0
    for index in sorted(latency):
        seen += latency[index]
        if seen >= rank:
            return LATENCY_BOUNDS_S[index]
    return None  # unreachable: the counts add up to total


def summarize(
    snapshots: Iterable[Mapping[str, Any]],
    now: float,
    window_s: float = WINDOW_S,
    rate_window_s: float = RATE_WINDOW_S,
) -> dict[str, Any]:
    """Every replica's snapshot added up: per place and model, requests/s over the last minute,
    p50/p99 and errors over the window, a requests-per-bucket series; route reasons; the most
    recent cold starts first."""
    series: dict[tuple[str, str], dict[int, int]] = {}
    latency: dict[tuple[str, str], dict[int, int]] = {}
    recent: dict[tuple[str, str], int] = {}
    errors: dict[tuple[str, str], int] = {}
    reasons: dict[str, int] = {}
    keys: dict[str, list[float]] = {}
    cold_starts: list[dict[str, Any]] = []
    for snapshot in snapshots:
        for bucket, key_id, *usage in snapshot.get("keys", []):
            if bucket + BUCKET_S > now - window_s:
                total = keys.setdefault(key_id, [0, 0, 0, 0.0])
                for index, value in enumerate(usage):
                    total[index] += value
        for bucket, place, model, cell in snapshot["cells"]:
            if bucket + BUCKET_S <= now - window_s:
                continue
            key = (place, model)
            per_bucket = series.setdefault(key, {})
            per_bucket[bucket] = per_bucket.get(bucket, 0) + cell["requests"]
            if bucket >= now - rate_window_s:
                recent[key] = recent.get(key, 0) + cell["requests"]
            errors[key] = errors.get(key, 0) + cell["errors"]
            histogram = latency.setdefault(key, {})
            for index, count in cell["latency"].items():
                histogram[int(index)] = histogram.get(int(index), 0) + count
            for reason, count in cell["reasons"].items():
                reasons[reason] = reasons.get(reason, 0) + count
        cold_starts.extend(
            event for event in snapshot["cold_starts"] if event["at_unix"] >= now - window_s
        )
    first_bucket = int((now - window_s) // BUCKET_S + 1) * BUCKET_S
    buckets = list(range(first_bucket, int(now // BUCKET_S) * BUCKET_S + 1, BUCKET_S))
    rows = []
    for (place, model), per_bucket in sorted(series.items()):
        key = (place, model)
        rows.append(
            {
                "place": place,
                "model": model,
                "requests_per_s": round(recent.get(key, 0) / rate_window_s, 3),
                "p50_s": _percentile(latency[key], 0.5),
                "p99_s": _percentile(latency[key], 0.99),
                "requests": sum(per_bucket.values()),
                "errors": errors.get(key, 0),
                "series": [per_bucket.get(bucket, 0) for bucket in buckets],
            }
        )
    cold_starts.sort(key=lambda event: event["at_unix"], reverse=True)
    top_keys = sorted(keys.items(), key=lambda item: (-item[1][3], -item[1][0], item[0]))
    return {
        "window_s": window_s,
        "bucket_s": BUCKET_S,
        "traffic": rows,
        "route_reasons": dict(sorted(reasons.items())),
        "cold_starts": cold_starts[:MAX_COLD_STARTS],
        # Top keys by cost, then requests.
        "keys": [
            {
                "key_id": key_id,
                "requests": int(requests),
                "input_tokens": int(input_tokens),
                "output_tokens": int(output_tokens),
                "cost_units": round(cost, 6),
            }
            for key_id, (requests, input_tokens, output_tokens, cost) in top_keys[:TOP_KEYS]
        ],
    }
