"""The shared view of every region's replica pool: replicas running (Serve's state, set from
outside), health from real request outcomes (outlier detection per model, over its regions),
back-pressure marks and measured cold starts. One board lives where all routers report to; each
router routes from its latest `snapshot()`.

Back-pressure is not a failure: a `saturated` outcome marks the pool full for a moment (requests
spill to the next region) and never counts toward ejection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from edge_sim.clock import Clock
from edge_sim.health import OutlierDetector
from edge_sim.regions import PoolView, RegionPolicy

OutcomeKind = Literal["ok", "failed", "saturated"]
# A cold start measured once weighs this much against what was known before (an EWMA).
_COLD_START_WEIGHT = 0.3


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one request attempt at a region went, as a router saw it."""

    model: str
    region: str
    kind: OutcomeKind
    cold_start_ms: float | None = None  # the request waited this long for a replica to start


@dataclass(frozen=True, slots=True)
class BoardSnapshot:
    """What routers route from; small and picklable (it crosses a Ray call every ~0.5 s)."""

    pools: dict[str, dict[str, PoolView]]  # model -> region -> pool
    cold_start_ms: dict[str, float]  # model -> measured (absent: none yet, the default holds)
    routers: int = 1  # router replicas running: each sends its share of a model's slots

    def pool(self, model: str, region: str) -> PoolView:
        return self.pools.get(model, {}).get(region, PoolView())


class RegionBoard:
    """Not thread-safe: one event loop (the edge-control replica) owns it."""

    def __init__(
        self,
        models: Sequence[str],
        regions: Sequence[str],
        policy: RegionPolicy,
        default_cold_start_ms: float,
        clock: Clock,
    ):
        self._models = list(models)
        self._regions = list(regions)
        self._policy = policy
        self._clock = clock
        self._health = {m: OutlierDetector(self._regions, policy.health, clock) for m in models}
        self._running: dict[tuple[str, str], int] = {}
        self._routers = 1
        self._wanted: dict[tuple[str, str], int] = {}
        self._full_until: dict[tuple[str, str], float] = {}
        self._default_cold_ms = default_cold_start_ms
        self._cold_ms: dict[str, float] = {}
        self.failures = dict.fromkeys(((m, r) for m in models for r in regions), 0)
        self.saturations = dict.fromkeys(((m, r) for m in models for r in regions), 0)

    def set_replicas(
        self,
        running: Mapping[tuple[str, str], int],
        wanted: Mapping[tuple[str, str], int] | None = None,
    ) -> None:
        """Serve's state: RUNNING (and, when known, target) replicas per (model, region)."""
        self._running = dict(running)
        if wanted is not None:
            self._wanted = dict(wanted)

    def set_routers(self, running: int) -> None:
        """Serve's RUNNING router replicas (at least 1: the one asking is running)."""
        self._routers = max(1, running)

    def report(self, outcomes: Iterable[Outcome]) -> None:
        now = self._clock()
        for outcome in outcomes:
            key = (outcome.model, outcome.region)
            if key not in self.failures:
                continue  # a model or region this app no longer has (config changed)
            if outcome.kind == "saturated":
                self.saturations[key] += 1
                self._full_until[key] = now + self._policy.saturation_hold_s
                continue
            if outcome.kind == "failed":
                self.failures[key] += 1
            self._health[outcome.model].record(outcome.region, outcome.kind == "ok")
            if outcome.cold_start_ms is not None:
                previous = self._cold_ms.get(outcome.model)
                self._cold_ms[outcome.model] = (
                    outcome.cold_start_ms
                    if previous is None
                    else (1 - _COLD_START_WEIGHT) * previous
                    + _COLD_START_WEIGHT * outcome.cold_start_ms
                )

    def cold_start_ms(self, model: str) -> float:
        return self._cold_ms.get(model, self._default_cold_ms)

    def pool(self, model: str, region: str) -> PoolView:
        key = (model, region)
        return PoolView(
            running=self._running.get(key, 0),
            ejected=self._health[model].state(region) == "ejected",
            saturated=self._full_until.get(key, 0.0) > self._clock(),
        )

    def snapshot(self) -> BoardSnapshot:
        return BoardSnapshot(
            pools={m: {r: self.pool(m, r) for r in self._regions} for m in self._models},
            # Measured ones only: a router tells its own measurements from the configured guess.
            cold_start_ms={m: ms for m, ms in self._cold_ms.items() if m in self._models},
            routers=self._routers,
        )

    def describe(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per region, for the admin API."""
        described = []
        for region in self._regions:
            models = {}
            for model in self._models:
                key = (model, region)
                pool = self.pool(model, region)
                models[model] = {
                    "replicas_running": pool.running,
                    "replicas_wanted": self._wanted.get(key, 0),
                    "warm": pool.warm,
                    "saturated": pool.saturated,
                    "health": self._health[model].snapshot(region),
                    "failures": self.failures[key],
                    "back_pressure": self.saturations[key],
                }
            described.append({"region": region, "models": models})
        return described
