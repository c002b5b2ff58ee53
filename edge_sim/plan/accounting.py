"""What a planner run counts: per pool the requests served, cold and queued, their latency
histogram and replica-seconds; per (model, home region) the requests no region took and the
attempts that failed; requests served per region over time. Everything counts from
`measure_from_s` on; the result is a `SimulationResult`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edge_sim.plan.stats import N_BINS, bins_of


@dataclass(slots=True)
class PoolStats:
    requests: int = 0  # served here (ok)
    cold: int = 0  # of those, waited for a replica that started after they arrived
    queued: int = 0  # waited for a free slot on a running replica
    histogram: list[int] = field(default_factory=lambda: [0] * N_BINS)
    replica_s: float = 0.0
    scale_from_zero: int = 0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, running, target)

    def add_replica_time(self, replicas: int, since: float, now: float) -> None:
        """`replicas` (running or starting) held from `since` to `now`: they cost from start."""
        if now > since:
            self.replica_s += replicas * (now - since)


@dataclass
class SimulationResult:
    models: tuple[str, ...]
    regions: tuple[str, ...]
    duration_s: float
    measured_from_s: float
    pools: dict[tuple[str, str], PoolStats]
    sheds: dict[tuple[str, str], int]  # (model, home region) -> requests no region took
    failed_attempts: dict[tuple[str, str], int]
    requests_timeline: np.ndarray  # regions x buckets: requests served per bucket
    timeline_s: float
    arrivals: int
    wall_s: float
    route_computations: int
    route_cache_hits: int
    cost_per_replica_s: dict[str, float]

    def cost_units(self, model: str, region: str) -> float:
        return self.pools[(model, region)].replica_s * self.cost_per_replica_s.get(model, 1.0)


class ServedChunk:
    """The requests of one trace chunk served (which request, which pool, latency in ms),
    tallied as they are served and folded into the run's histograms and timeline at the
    chunk's end with numpy: cheaper than per request."""

    __slots__ = ("requests", "pools", "latency_ms")

    def __init__(self) -> None:
        self.requests, self.pools, self.latency_ms = array("q"), array("q"), array("d")

    def served(self, request: int, pool_index: int, latency_ms: float) -> None:
        self.requests.append(request)
        self.pools.append(pool_index)
        self.latency_ms.append(latency_ms)


class RunAccounts:
    """The counts of one run, for pools indexed 0..n-1 (`pool_regions[i]`: pool i's region's
    row in the timeline)."""

    def __init__(
        self, pool_regions: Sequence[int], regions: int, duration_s: float, timeline_s: float
    ):
        self.timeline_s = timeline_s
        self.buckets = max(1, math.ceil(duration_s / timeline_s))
        self.histograms = np.zeros((len(pool_regions), N_BINS), dtype=np.int64)
        self.served_timeline = np.zeros((regions, self.buckets), dtype=np.int64)
        self.pool_region = np.array(pool_regions, dtype=np.int64)
        self.sheds: dict[tuple[str, str], int] = {}
        self.failed_attempts: dict[tuple[str, str], int] = {}
        self.arrivals = 0

    def shed(self, model: str, home: str) -> None:
        key = (model, home)
        self.sheds[key] = self.sheds.get(key, 0) + 1

    def failed_attempt(self, model: str, region: str) -> None:
        key = (model, region)
        self.failed_attempts[key] = self.failed_attempts.get(key, 0) + 1

    def fold(self, served: ServedChunk, arrival_s: np.ndarray) -> None:
        """A chunk's served requests (`arrival_s`: the chunk's arrival times) into the
        histograms and the timeline."""
        if not served.requests:
            return
        where = np.frombuffer(served.pools, dtype=np.int64)
        np.add.at(self.histograms, (where, bins_of(np.frombuffer(served.latency_ms))), 1)
        requests = np.frombuffer(served.requests, dtype=np.int64)
        buckets = (arrival_s[requests] / self.timeline_s).astype(np.int64)
        inside = buckets < self.buckets
        np.add.at(self.served_timeline, (self.pool_region[where[inside]], buckets[inside]), 1)

    def close_pool(self, index: int, stats: PoolStats) -> None:
        """Pool `index`'s histogram and served count into its stats, at the run's end."""
        stats.histogram = self.histograms[index].tolist()
        stats.requests = int(self.histograms[index].sum())
