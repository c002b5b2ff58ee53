"""Policies to compare on one trace: Serve's scale-to-zero with other delays or floors, keep-warm
hours, always-warm, and predictive pre-warming. Each is a set of autoscaling overrides and an
optional floor policy; `compare` runs them all through the same simulation."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge_sim.faults import ColoFault
from edge_sim.plan.autoscaler import PoolSpec
from edge_sim.plan.simulator import (
    FloorPolicy,
    RegionOutage,
    SimSettings,
    SimulationResult,
    Simulator,
)
from edge_sim.plan.trace import Trace
from edge_sim.plan.world import World
from edge_sim.prewarm import PredictivePrewarm, PrewarmConfig

Specs = Mapping[Any, PoolSpec]


@dataclass(frozen=True)
class Policy:
    """A named variant: `autoscaling` overrides every deployment's autoscaling_config fields;
    `floor` builds a floor policy for the run (it keeps state, so one per run)."""

    name: str
    autoscaling: Mapping[str, Any] = field(default_factory=dict)
    floor: Callable[[World, Trace], FloorPolicy] | None = None
    description: str = ""

    def specs(self, base: Specs) -> dict[Any, PoolSpec]:
        if not self.autoscaling:
            return dict(base)
        return {
            key: spec.model_copy(
                update={
                    "autoscaling_config": spec.autoscaling_config.model_copy(
                        update=dict(self.autoscaling)
                    )
                }
            )
            for key, spec in base.items()
        }


class LocalHoursFloor:
    """Keep-warm hours in each region's local (solar) time: `replicas` from start_h to end_h,
    the shape of a KeepWarm schedule (deployments/control/keep_warm.py) written per region."""

    def __init__(
        self,
        world: World,
        models: Sequence[str],
        start_h: float,
        end_h: float,
        replicas: int = 1,
        start_utc_hour: float = 0.0,
    ):
        self.interval_s = 60.0
        self._models = list(models)
        self._offsets = {r: world.region_position(r)[1] / 15.0 for r in world.region_names}
        self._start, self._end, self._replicas = start_h, end_h, replicas
        self._utc0 = start_utc_hour

    def floors(self, now_s: float, demand: Mapping[tuple[str, str], int]) -> dict:
        out = {}
        for region, offset in self._offsets.items():
            local = (now_s / 3600.0 + self._utc0 + offset) % 24.0
            inside = (
                self._start <= local < self._end
                if self._start < self._end
                else (local >= self._start or local < self._end)
            )
            if inside:
                out.update({(m, region): self._replicas for m in self._models})
        return out


def scale_to_zero(delay_s: float | None = None) -> Policy:
    if delay_s is None:
        return Policy("scale-to-zero", description="the config as it is")
    return Policy(
        f"scale-to-zero {delay_s:g}s",
        {"downscale_to_zero_delay_s": delay_s},
        description=f"downscale_to_zero_delay_s: {delay_s:g}",
    )


def always_warm(replicas: int = 1) -> Policy:
    return Policy(
        f"min {replicas}",
        {"min_replicas": replicas, "initial_replicas": replicas},
        description=f"min_replicas: {replicas} everywhere",
    )


def keep_warm_hours(start_h: float, end_h: float, start_utc_hour: float = 0.0) -> Policy:
    return Policy(
        f"keep-warm {start_h:g}-{end_h:g}h",
        floor=lambda world, trace: LocalHoursFloor(
            world, trace.models, start_h, end_h, start_utc_hour=start_utc_hour
        ),
        description=f"one replica {start_h:g}:00-{end_h:g}:00 local time per region",
    )


def predictive(config: PrewarmConfig | None = None, name: str = "predictive") -> Policy:
    config = config or PrewarmConfig()
    return Policy(
        name,
        floor=lambda world, trace: PredictivePrewarm(
            config, config.keys(trace.models, world.region_names)
        ),
        description=(
            f"one replica while max(same time yesterday, EWMA) expects >= "
            f"{config.min_expected:g} requests in {config.lookahead_s:g}s"
        ),
    )


def compare(
    world: World,
    trace_factory: Callable[[], Trace],
    base: Specs,
    policies: Sequence[Policy],
    settings: SimSettings | None = None,
    outages: Sequence[RegionOutage] = (),
    colo_faults: Mapping[str, Sequence[ColoFault]] | None = None,
) -> list[tuple[Policy, SimulationResult]]:
    """Every policy on the same trace (a factory: a trace streams once, so one per run) and the
    same drills."""
    results = []
    for policy in policies:
        trace = trace_factory()
        floor = policy.floor(world, trace) if policy.floor else None
        sim = Simulator(
            world,
            policy.specs(base),
            settings,
            outages=outages,
            colo_faults=colo_faults,
            policy=floor,
        )
        results.append((policy, sim.run(trace)))
    return results
