"""Ray Serve's default autoscaling policy, as a state machine on the planner's clock.

A port of Ray Serve 2.60's `replica_queue_length_autoscaling_policy` with the wrapper every policy
runs under (`ray.serve.autoscaling_policy`): the cold-start fast path (zero running replicas and a
queued request: one replica now, no delay), desired = look-back average of ongoing requests /
`target_ongoing_requests`, the scaling factors, the bounds, and the delay logic (a decision must
hold for `upscale_delay_s`, `downscale_delay_s`, or `downscale_to_zero_delay_s` for 1 -> 0).
tests/unit/test_plan_autoscaler.py replays random metric series through Ray's own functions and
this model and asks for the same decisions, so a Ray upgrade that changes them fails there.
"""

from __future__ import annotations

import math
from collections import deque

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Ray's tolerance for comparing elapsed time with a delay (floating-point time stamps).
_DELAY_EPS_S = 1e-6


class AutoscalingSpec(BaseModel):
    """The `autoscaling_config` fields the planner models, with Ray Serve 2.60's defaults.
    Fields it does not model (`policy`, smoothing) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=1, ge=1)
    initial_replicas: int | None = Field(default=None, ge=0)
    target_ongoing_requests: float = Field(default=2.0, gt=0)
    upscale_delay_s: float = Field(default=30.0, ge=0)
    downscale_delay_s: float = Field(default=600.0, ge=0)
    downscale_to_zero_delay_s: float | None = Field(default=None, ge=0)
    look_back_period_s: float = Field(default=30.0, gt=0)
    metrics_interval_s: float = Field(default=10.0, gt=0)
    upscaling_factor: float | None = Field(default=None, gt=0)
    downscaling_factor: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _bounds_ordered(self) -> AutoscalingSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError("min_replicas must be <= max_replicas")
        initial = self.initial_replicas
        if initial is not None and not self.min_replicas <= initial <= self.max_replicas:
            raise ValueError("initial_replicas must lie between min_replicas and max_replicas")
        return self

    @property
    def start_replicas(self) -> int:
        """Replicas when the deployment is deployed (Serve: initial_replicas, else min)."""
        return self.min_replicas if self.initial_replicas is None else self.initial_replicas


class PoolSpec(BaseModel):
    """One deployment (a model in a region): its autoscaling and its admission limits."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    autoscaling_config: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    max_ongoing_requests: int = Field(default=5, ge=1)
    max_queued_requests: int = Field(default=-1, ge=-1, description="-1: unlimited (Serve)")


class ServeAutoscaler:
    """One deployment's autoscaling decisions. `observe` the ongoing requests (queued at
    handles + running at replicas) every metrics interval; `decide` returns the new target."""

    def __init__(self, spec: AutoscalingSpec):
        self.spec = spec
        self._samples: deque[tuple[float, float]] = deque()
        self._sum = 0.0
        self._since: float | None = None  # when the pending decision started holding
        self._direction = 0  # +1 a pending scale-up, -1 a pending scale-down

    def observe(self, now: float, ongoing: float) -> None:
        samples = self._samples
        samples.append((now, ongoing))
        self._sum += ongoing
        horizon = now - self.spec.look_back_period_s
        while samples[0][0] <= horizon:
            self._sum -= samples.popleft()[1]

    def skipped_idle(self, now: float, tick_s: float, *, include_now: bool) -> None:
        """The pool was idle and not ticked: the samples it missed in the look-back window
        (ticks on the k x tick_s beat, up to now) were zeros. Put them in, so the average is
        the one Serve would compute."""
        self._samples.clear()
        self._sum = 0.0
        ticks = math.floor(now / tick_s + 1e-9) - (0 if include_now else 1)
        first = math.floor((now - self.spec.look_back_period_s) / tick_s + 1e-9) + 1
        for k in range(max(0, first), ticks + 1):
            self._samples.append((k * tick_s, 0.0))

    def idle_decision_at(self, now: float, running: int, target: int, floor: int) -> float | None:
        """For a pool whose every sample is now zero, and stays zero: when the decision it
        holds would fire (Serve's delay since it began holding), or None if none is pending.
        Call right after `decide` at `now`."""
        if self._since is None or self._direction == 0:
            return None
        spec = self.spec
        if self._direction > 0:
            return self._since + spec.upscale_delay_s
        if target == 1 and spec.downscale_to_zero_delay_s is not None:
            return self._since + spec.downscale_to_zero_delay_s
        return self._since + spec.downscale_delay_s

    @property
    def average_ongoing(self) -> float:
        return self._sum / len(self._samples) if self._samples else 0.0

    def decide(self, now: float, running: int, target: int, floor: int = 0) -> int:
        """The deployment's new target replicas. `floor`: what a custom policy (a keep-warm
        schedule, pre-warming) asks for at least; Serve takes the max with the request-based
        desire and applies delays and bounds to it, as for KeepWarm."""
        spec = self.spec
        total = self.average_ongoing
        if running == 0 and total > 0:
            # Ray's cold-start fast path: bypasses delays; the decision state is kept.
            return max(math.ceil(spec.upscaling_factor or 1.0), target)
        desired: float = target if running == 0 else total / spec.target_ongoing_requests
        desired = max(desired, floor)
        scaled = self._scaled(desired, running)
        bounded = min(max(scaled, spec.min_replicas), spec.max_replicas)
        if running == 0 and bounded > 0:
            return bounded  # Ray: scale-ups from zero bypass the delay logic
        return self._delayed(max(0, bounded), target, now)

    def _scaled(self, desired: float, running: int) -> int:
        if running == 0:
            return math.ceil(desired)
        delta = desired - running
        factor = (self.spec.upscaling_factor if delta > 0 else self.spec.downscaling_factor) or 1.0
        scaled = math.ceil(running + factor * delta)
        if math.ceil(desired) < running and scaled == running:
            scaled -= 1  # a factor must never stall a downscale
        return scaled

    def _delayed(self, desired: int, target: int, now: float) -> int:
        spec = self.spec
        if desired > target:
            if self._direction < 0:
                self._since = None
            self._direction = 1
            if self._since is None:
                self._since = now
            if now - self._since + _DELAY_EPS_S >= spec.upscale_delay_s:
                self._reset()
                return desired
            return target
        if desired < target:
            if self._direction > 0:
                self._since = None
            self._direction = -1
            if target == 1 and spec.downscale_to_zero_delay_s is not None:
                delay_s = spec.downscale_to_zero_delay_s
            else:
                delay_s = spec.downscale_delay_s
            if target != 1:
                desired = max(1, desired)  # only 1 -> 0 reaches zero
            if self._since is None:
                self._since = now
            if now - self._since + _DELAY_EPS_S >= delay_s:
                self._reset()
                return desired
            return target
        self._reset()
        return target

    def _reset(self) -> None:
        self._since = None
        self._direction = 0
