"""Injected faults for drills: a colo down, slower, or failing a share of requests, for a while."""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_sim.clock import Clock
from edge_sim.topology import UnknownColoError


class ColoFault(BaseModel):
    """What goes wrong at a colo and when, relative to the moment the fault is set.

    Faults declared in config are set when the network starts, so `start_after_s` schedules an
    outage window into a run; the admin API sets them at request time.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    down: bool = False
    added_latency_ms: float = Field(default=0.0, ge=0.0)
    error_rate: float = Field(default=0.0, ge=0.0, le=1.0)
    start_after_s: float = Field(default=0.0, ge=0.0)
    duration_s: float | None = Field(default=None, gt=0.0, description="None: until cleared")

    @model_validator(mode="after")
    def _does_something(self) -> ColoFault:
        if not self.down and self.added_latency_ms == 0 and self.error_rate == 0:
            raise ValueError("a fault must set down, added_latency_ms or error_rate")
        return self


@dataclass(frozen=True, slots=True)
class ScheduledFault:
    fault: ColoFault
    starts_at: float
    ends_at: float  # math.inf: until cleared

    def active_at(self, now: float) -> bool:
        return self.starts_at <= now < self.ends_at

    def describe(self, now: float) -> dict[str, Any]:
        return {
            **self.fault.model_dump(include={"down", "added_latency_ms", "error_rate"}),
            "active": self.active_at(now),
            "starts_in_s": max(0.0, self.starts_at - now),
            "ends_in_s": None if math.isinf(self.ends_at) else max(0.0, self.ends_at - now),
        }


@dataclass(frozen=True, slots=True)
class FaultEffect:
    """All faults active at one colo, combined."""

    down: bool
    added_latency_ms: float
    error_rate: float


class FaultBook:
    """Faults per colo over time. Failure draws come from one seeded RNG, so a drill replays."""

    def __init__(self, colo_ids: Iterable[str], clock: Clock, rng: random.Random):
        self._clock = clock
        self._rng = rng
        self._faults: dict[str, list[ScheduledFault]] = {colo_id: [] for colo_id in colo_ids}
        self._faulted: set[str] = set()  # colos with any fault, so a request scans only these

    def add(self, colo_id: str, fault: ColoFault) -> ScheduledFault:
        """Schedule one more fault at the colo (faults at one colo combine)."""
        faults = self._list(colo_id)
        starts_at = self._clock() + fault.start_after_s
        ends_at = math.inf if fault.duration_s is None else starts_at + fault.duration_s
        scheduled = ScheduledFault(fault, starts_at, ends_at)
        faults.append(scheduled)
        self._faulted.add(colo_id)
        return scheduled

    def set(self, colo_id: str, fault: ColoFault) -> ScheduledFault:
        """Replace the colo's faults with this one."""
        self.clear(colo_id)
        return self.add(colo_id, fault)

    def clear(self, colo_id: str) -> None:
        self._list(colo_id).clear()
        self._faulted.discard(colo_id)

    def clear_all(self) -> None:
        for colo_id in list(self._faulted):
            self.clear(colo_id)

    def scheduled(self, colo_id: str) -> list[ScheduledFault]:
        """Faults active now or still to come."""
        self._prune(colo_id, self._clock())
        return list(self._list(colo_id))

    def effect(self, colo_id: str) -> FaultEffect | None:
        """The combined fault active at the colo now, or None."""
        self._list(colo_id)
        return self._effect_at(colo_id, self._clock())

    def active_effects(self) -> dict[str, FaultEffect]:
        """Every colo with an active fault now, with its combined effect."""
        now = self._clock()
        effects = {}
        for colo_id in sorted(self._faulted):
            effect = self._effect_at(colo_id, now)
            if effect is not None:
                effects[colo_id] = effect
        return effects

    def should_fail(self, colo_id: str) -> bool:
        """Does this request fail because of an injected error rate? Draws only when one is set."""
        effect = self.effect(colo_id)
        if effect is None or effect.error_rate == 0:
            return False
        return self._rng.random() < effect.error_rate

    def _list(self, colo_id: str) -> list[ScheduledFault]:
        try:
            return self._faults[colo_id]
        except KeyError:
            raise UnknownColoError(colo_id) from None

    def _effect_at(self, colo_id: str, now: float) -> FaultEffect | None:
        self._prune(colo_id, now)
        active = [s.fault for s in self._faults[colo_id] if s.active_at(now)]
        return _combine(active) if active else None

    def _prune(self, colo_id: str, now: float) -> None:
        faults = self._faults[colo_id]
        faults[:] = [s for s in faults if s.ends_at > now]
        if not faults:
            self._faulted.discard(colo_id)


def _combine(faults: list[ColoFault]) -> FaultEffect:
    if len(faults) == 1:  # exact, without the float round trip below
        fault = faults[0]
        return FaultEffect(fault.down, fault.added_latency_ms, fault.error_rate)
    survive = 1.0  # a request succeeds only if no fault fails it
    for fault in faults:
        survive *= 1.0 - fault.error_rate
    return FaultEffect(
        down=any(fault.down for fault in faults),
        added_latency_ms=sum(fault.added_latency_ms for fault in faults),
        error_rate=1.0 - survive,
    )
