"""Scenarios as schedules: when each request is sent, to which model and API, from which region,
and which admin calls happen when. Pure and seeded: the same config gives the same schedule."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_sim.faults import ColoFault
from edge_sim.plan.trace import daily_rate
from edgectl.loadtest.regions import DEFAULT_REGION, DEFAULT_REGIONS, ClientRegion, region_named

ScenarioName = Literal[
    "steady", "ramp", "burst-after-idle", "geo-mix", "diurnal", "colo-outage", "region-outage"
]
SCENARIOS: tuple[str, ...] = get_args(ScenarioName)
Task = Literal["chat", "embedding", "moderation"]
Api = Literal["openai", "workers"]
RateAt = Callable[[np.ndarray], np.ndarray]  # seconds since start -> requests per second


class ModelTarget(BaseModel):
    """A model the load goes to and the task it serves (which decides endpoint and payload)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    task: Task


class ScenarioConfig(BaseModel):
    """Everything a schedule depends on. Fields a scenario does not use are ignored by it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    scenario: ScenarioName
    models: tuple[ModelTarget, ...] = Field(min_length=1)
    rate_rps: float = Field(default=2.0, gt=0, description="Poisson rate; ramp: the final rate")
    duration_s: float = Field(default=60.0, gt=0, description="burst-after-idle: the burst")
    max_requests: int | None = Field(default=None, ge=1, description="keep the first N")
    seed: int = 0
    workers_api_share: float = Field(default=0.1, ge=0, le=1, description="share to /ai/run")
    region: str = Field(default=DEFAULT_REGION, description="clients' region (not geo-mix)")
    ramp_start_rps: float | None = Field(default=None, ge=0, description="None: rate / 10")
    warm_s: float = Field(
        default=2.0, ge=0, description="burst-after-idle: one priming request per model in it"
    )
    idle_s: float = Field(default=315.0, ge=0, description="burst-after-idle: the silent gap")
    fault_colo: str | None = Field(default=None, description="colo-outage: where the fault goes")
    fault_region: str | None = Field(
        default=None, description="region-outage: the region whose replicas the drill fails"
    )
    outage_fault: ColoFault = Field(default_factory=lambda: ColoFault(down=True))
    outage_start_s: float | None = Field(default=None, ge=0, description="None: duration / 3")
    outage_s: float | None = Field(default=None, gt=0, description="None: duration / 3")
    day_s: float = Field(
        default=86_400.0, gt=0, description="diurnal: a day's length (shorter: a day compressed)"
    )
    trough_ratio: float = Field(
        default=0.05, ge=0, le=1, description="diurnal: the night's rate over the peak's"
    )

    @model_validator(mode="after")
    def _scenario_needs(self) -> ScenarioConfig:
        names = [model.name for model in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"models: duplicate names in {names}")
        if self.scenario in ("colo-outage", "region-outage"):
            if self.scenario == "colo-outage" and not self.fault_colo:
                raise ValueError("colo-outage needs fault_colo")
            if self.scenario == "region-outage" and not self.fault_region:
                raise ValueError("region-outage needs fault_region")
            start, length = self.outage_window_s
            if start + length > self.duration_s:
                raise ValueError(
                    f"the outage ({start:g} s + {length:g} s) must end within duration_s "
                    f"({self.duration_s:g} s), so the run shows recovery"
                )
        return self

    @property
    def outage_window_s(self) -> tuple[float, float]:
        """(start, length) of the colo or region outage."""
        start = self.duration_s / 3 if self.outage_start_s is None else self.outage_start_s
        length = self.duration_s / 3 if self.outage_s is None else self.outage_s
        return start, length


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request to send: `at_s` seconds after the run starts."""

    seq: int
    at_s: float
    model: ModelTarget
    api: Api
    region: ClientRegion
    prompt: int  # index into the task's prompts (edgectl.loadtest.workload)


@dataclass(frozen=True, slots=True)
class AdminAction:
    """An admin API call made during the run (a fault set or cleared)."""

    at_s: float
    method: Literal["POST", "DELETE"]
    colo: str  # the colo, or the region when kind is "regions"
    label: str
    body: Mapping[str, Any] | None = None
    kind: Literal["colos", "regions"] = "colos"

    @property
    def path(self) -> str:
        return f"/admin/{self.kind}/{self.colo}/faults"


@dataclass(frozen=True, slots=True)
class Phase:
    """A named stretch of the run (plots shade them; summaries can split by them)."""

    name: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Schedule:
    scenario: ScenarioName
    arrivals: tuple[Arrival, ...]
    phases: tuple[Phase, ...]
    actions: tuple[AdminAction, ...] = field(default=())

    @property
    def end_s(self) -> float:
        return max(phase.end_s for phase in self.phases)

    def phase_at(self, t_s: float) -> Phase | None:
        for phase in self.phases:
            if phase.start_s <= t_s < phase.end_s:
                return phase
        return None


def poisson_times(
    rng: np.random.Generator,
    start_s: float,
    end_s: float,
    peak_rps: float,
    rate_at: RateAt | None = None,
) -> np.ndarray:
    """Arrival times of a Poisson process on [start_s, end_s), sorted.

    Homogeneous at `peak_rps`, or, with `rate_at`, thinned to that rate (which must stay at or
    below the peak). Given their count, Poisson arrivals are uniform on the interval, so one
    Poisson draw and one sorted uniform draw give the exact process without a loop.
    """
    length_s = end_s - start_s
    if length_s <= 0 or peak_rps <= 0:
        return np.empty(0)
    count = int(rng.poisson(peak_rps * length_s))
    times = np.sort(rng.uniform(start_s, end_s, count))
    if rate_at is None:
        return times
    keep = rng.uniform(0.0, 1.0, count) * peak_rps < rate_at(times)
    return times[keep]


def build_schedule(
    config: ScenarioConfig, regions: tuple[ClientRegion, ...] = DEFAULT_REGIONS
) -> Schedule:
    """The config's schedule; the same config (seed included) always gives the same one."""
    rng = np.random.default_rng(config.seed)
    region_index: np.ndarray | None = None  # the client region of each arrival, if drawn
    actions: tuple[AdminAction, ...]
    if config.scenario == "diurnal":
        times, region_index = _diurnal(config, regions, rng)
        phases, actions = _days(config), ()
    else:
        times, phases, actions = _timeline(config, rng)
    priming = _priming_count(config)
    if config.max_requests is not None:
        times = times[: config.max_requests]
    count = len(times)
    if region_index is not None:
        clients = [regions[i] for i in region_index[:count]]
    elif config.scenario == "geo-mix":
        weights = np.array([region.weight for region in regions], dtype=float)
        region_index = rng.choice(len(regions), size=count, p=weights / weights.sum())
        clients = [regions[i] for i in region_index]
    else:
        clients = [region_named(config.region, regions)] * count
    # Priming requests go to each model in turn; the rest draw a model uniformly.
    model_index = rng.integers(0, len(config.models), size=count)
    model_index[: min(priming, count)] = np.arange(min(priming, count))
    workers = rng.uniform(0.0, 1.0, size=count) < config.workers_api_share
    prompts = rng.integers(0, 1 << 16, size=count)
    arrivals = tuple(
        Arrival(
            seq=i,
            at_s=float(times[i]),
            model=config.models[int(model_index[i])],
            api="workers" if workers[i] else "openai",
            region=clients[i],
            prompt=int(prompts[i]),
        )
        for i in range(count)
    )
    return Schedule(config.scenario, arrivals, phases, actions)


def _diurnal(
    config: ScenarioConfig, regions: tuple[ClientRegion, ...], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Each client region's requests follow a cosine day in its local solar time (15 degrees of
    longitude an hour), the planner's `diurnal` shape; `rate_rps` is the total at every region's
    peak. Send times, sorted, and the client region of each."""
    weights = np.array([region.weight for region in regions], dtype=float)
    weights /= weights.sum()
    times, owners = [], []
    for index, (region, weight) in enumerate(zip(regions, weights, strict=True)):
        peak = config.rate_rps * weight

        def rate_at(t: np.ndarray, offset_h: float = region.lon / 15.0, peak: float = peak):
            local_hour = (t / config.day_s * 24.0 + offset_h) % 24.0
            return peak * daily_rate("diurnal", local_hour, trough_ratio=config.trough_ratio)

        sent = poisson_times(rng, 0.0, config.duration_s, peak, rate_at)
        times.append(sent)
        owners.append(np.full(len(sent), index))
    merged = np.concatenate(times)
    order = np.argsort(merged, kind="stable")
    return merged[order], np.concatenate(owners)[order]


def _days(config: ScenarioConfig) -> tuple[Phase, ...]:
    day_s, duration = config.day_s, config.duration_s
    return tuple(
        Phase(f"day {n + 1}", n * day_s, min(duration, (n + 1) * day_s))
        for n in range(math.ceil(duration / day_s))
    )


def _priming_count(config: ScenarioConfig) -> int:
    return len(config.models) if config.scenario == "burst-after-idle" and config.warm_s else 0


def _timeline(
    config: ScenarioConfig, rng: np.random.Generator
) -> tuple[np.ndarray, tuple[Phase, ...], tuple[AdminAction, ...]]:
    rate, duration = config.rate_rps, config.duration_s
    if config.scenario == "ramp":
        start_rps = rate / 10 if config.ramp_start_rps is None else config.ramp_start_rps
        peak = max(start_rps, rate)

        def linear(t: np.ndarray) -> np.ndarray:
            return start_rps + (rate - start_rps) * (t / duration)

        return poisson_times(rng, 0.0, duration, peak, linear), (Phase("ramp", 0, duration),), ()
    if config.scenario == "burst-after-idle":
        warm, idle = config.warm_s, config.idle_s
        # One request per model spread over the warm phase, so each model's scale-to-zero
        # timer starts at a known moment before the idle gap.
        n = len(config.models)
        priming = (np.arange(n) + 0.5) * (warm / n) if warm else np.empty(0)
        burst_start = warm + idle
        burst = poisson_times(rng, burst_start, burst_start + duration, rate)
        burst_phases: tuple[Phase, ...] = (
            Phase("idle", warm, burst_start),
            Phase("burst", burst_start, burst_start + duration),
        )
        if warm:
            burst_phases = (Phase("warm", 0.0, warm), *burst_phases)
        return np.concatenate([priming, burst]), burst_phases, ()
    times = poisson_times(rng, 0.0, duration, rate)
    if config.scenario in ("colo-outage", "region-outage"):
        # A region outage is a drill its replicas act out: they fail the requests that reach
        # them, and the router fails over for real (a killed node is the other way, by hand).
        kind: Literal["colos", "regions"] = "colos"
        target = config.fault_colo
        if config.scenario == "region-outage":
            kind, target = "regions", config.fault_region
        assert target is not None  # checked by the config validator
        start, length = config.outage_window_s
        body = config.outage_fault.model_dump(mode="json", exclude_defaults=True)
        actions = (
            AdminAction(start, "POST", target, "fault injected", body, kind),
            AdminAction(start + length, "DELETE", target, "fault cleared", kind=kind),
        )
        phases = (
            Phase("before", 0.0, start),
            Phase("outage", start, start + length),
            Phase("after", start + length, duration),
        )
        return times, phases, actions
    return times, (Phase(config.scenario, 0.0, duration),), ()
