"""Envoy-style passive outlier detection, driven by real request results and a clock. The region
board (edge_sim/region_board.py) runs one per model over its regions' replica pools; the members
are called colos here, for any named member set.

healthy --(N consecutive failures, or failure rate over a window)--> ejected
ejected --(ejection time over; it grows with each ejection)--> half_open
half_open --(next outcome ok)--> healthy      half_open --(next outcome failed)--> ejected

As in Envoy, an ejected member returns to rotation when its ejection time is over; no probe
budget holds traffic back. Half-open is stricter than Envoy (which counts from zero again): the
first failure ejects it again, for longer, so a member still broken costs only the requests sent
before that failure is known, and those fail over.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_sim.clock import Clock
from edge_sim.topology import UnknownColoError

HealthState = Literal["healthy", "ejected", "half_open"]


class OutlierDetectionConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    consecutive_failures: int = Field(default=5, ge=1)
    failure_rate: float = Field(
        default=0.5, gt=0.0, le=1.0, description="ejects when failures/requests in the window >= it"
    )
    window_s: float = Field(default=30.0, gt=0.0)
    min_requests: int = Field(default=10, ge=1, description="window volume before the rate counts")
    base_ejection_s: float = Field(default=30.0, gt=0.0)
    max_ejection_s: float = Field(default=300.0, gt=0.0)
    max_ejection_percent: float = Field(default=50.0, ge=0.0, le=100.0)
    ejection_decay_s: float = Field(
        default=60.0, gt=0.0, description="healthy time that forgives one past ejection"
    )

    @model_validator(mode="after")
    def _max_not_below_base(self) -> OutlierDetectionConfig:
        if self.max_ejection_s < self.base_ejection_s:
            raise ValueError("max_ejection_s must be >= base_ejection_s")
        return self


@dataclass(slots=True)
class _ColoHealth:
    state: HealthState = "healthy"
    consecutive_failures: int = 0
    window: deque[tuple[float, bool]] = field(default_factory=deque)
    window_failures: int = 0
    ejections: int = 0
    ejected_until: float = 0.0
    decay_from: float = 0.0  # when the healthy stretch that forgives ejections began

    def forget_window(self) -> None:
        self.window.clear()
        self.window_failures = 0
        self.consecutive_failures = 0


class OutlierDetector:
    """Health of every colo. Not thread-safe: one router event loop owns it."""

    def __init__(self, colo_ids: Iterable[str], config: OutlierDetectionConfig, clock: Clock):
        self._config = config
        self._clock = clock
        self._colos = {colo_id: _ColoHealth() for colo_id in colo_ids}
        # Colos ejected or half-open: they count toward max_ejection_percent.
        self._out: dict[str, _ColoHealth] = {}

    def state(self, colo_id: str) -> HealthState:
        health = self._health(colo_id)
        self._advance(health, self._clock())
        return health.state

    def ejections(self, colo_id: str) -> int:
        """Ejections not yet forgiven; the next ejection lasts base_ejection_s x (this + 1)."""
        health = self._health(colo_id)
        self._advance(health, self._clock())
        return health.ejections

    def record(self, colo_id: str, ok: bool) -> None:
        health = self._health(colo_id)
        now = self._clock()
        self._advance(health, now)
        if health.state == "ejected":
            return  # started before the ejection; says nothing new
        if health.state == "half_open":
            if ok:
                health.state = "healthy"
                health.decay_from = now
                health.forget_window()
                del self._out[colo_id]
            else:
                self._eject(colo_id, health, now)
            return
        self._count(health, ok, now)
        if not ok and self._is_outlier(health) and self._may_eject():
            self._eject(colo_id, health, now)

    def snapshot(self, colo_id: str) -> dict[str, Any]:
        health = self._health(colo_id)
        now = self._clock()
        self._advance(health, now)
        return {
            "state": health.state,
            "ejections": health.ejections,
            "ejected_for_s": max(0.0, health.ejected_until - now)
            if health.state == "ejected"
            else 0.0,
            "consecutive_failures": health.consecutive_failures,
            "window_requests": len(health.window),
            "window_failures": health.window_failures,
        }

    def _health(self, colo_id: str) -> _ColoHealth:
        try:
            return self._colos[colo_id]
        except KeyError:
            raise UnknownColoError(colo_id) from None

    def _advance(self, health: _ColoHealth, now: float) -> None:
        """Apply what the passing of time does: end ejections, forgive old ones."""
        if health.state == "ejected" and now >= health.ejected_until:
            health.state = "half_open"
        elif health.state == "healthy" and health.ejections > 0:
            forgiven = int((now - health.decay_from) // self._config.ejection_decay_s)
            if forgiven > 0:
                health.ejections = max(0, health.ejections - forgiven)
                health.decay_from += forgiven * self._config.ejection_decay_s

    def _count(self, health: _ColoHealth, ok: bool, now: float) -> None:
        window = health.window
        window.append((now, ok))
        if not ok:
            health.window_failures += 1
        health.consecutive_failures = 0 if ok else health.consecutive_failures + 1
        horizon = now - self._config.window_s
        while window and window[0][0] <= horizon:
            _, old_ok = window.popleft()
            if not old_ok:
                health.window_failures -= 1

    def _is_outlier(self, health: _ColoHealth) -> bool:
        config = self._config
        if health.consecutive_failures >= config.consecutive_failures:
            return True
        requests = len(health.window)
        return (
            requests >= config.min_requests
            and health.window_failures >= config.failure_rate * requests
        )

    def _may_eject(self) -> bool:
        # Never take more than max_ejection_percent of colos out at once, so a global fault
        # (or a bad client) cannot empty the network; one ejection is always allowed, but never
        # of the last one in rotation: a failing host beats no host at all.
        out = len(self._out)
        if out + 1 >= len(self._colos):
            return False
        return out == 0 or (out + 1) * 100 <= self._config.max_ejection_percent * len(self._colos)

    def _eject(self, colo_id: str, health: _ColoHealth, now: float) -> None:
        config = self._config
        health.ejections += 1
        health.state = "ejected"
        health.ejected_until = now + min(
            config.base_ejection_s * health.ejections, config.max_ejection_s
        )
        health.forget_window()
        self._out[colo_id] = health
