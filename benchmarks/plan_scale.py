"""The capacity planner's figures (no Ray): one simulated day of ten million requests over 300
colos and 20 regions (wall time, CPU time and memory peak; goal: under 5 minutes on this 2-core
machine), and predictive pre-warming against scale-to-zero and always-warm on the same traces
(goal: at least 80% of scale-to-zero's cold starts hidden for at most 25% more replica-seconds).
Self-contained: `python -m benchmarks.plan_scale [--quick]` runs it alone, `benchmarks.run`
lists it as the `plan` suite."""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any

from benchmarks.lib.goals import GoalRecord, goal
from edge_sim.config import EdgeConfig
from edge_sim.plan.autoscaler import AutoscalingSpec, PoolSpec
from edge_sim.plan.policies import always_warm, compare, predictive, scale_to_zero
from edge_sim.plan.simulator import SimSettings, Simulator
from edge_sim.plan.summary import extra_replica_share, hidden_share, totals
from edge_sim.plan.trace import TraceSpec, generate
from edge_sim.plan.world import World, synthetic_world

NEEDS_RAY = False
DAY_S = 86_400.0
SCALE_GOAL_S = 300.0
HIDDEN_GOAL, EXTRA_COST_GOAL = 0.80, 0.25
MODELS = {"glm": 1.0, "kimi": 1.0, "embedding": 2.0, "moderation": 2.0}
# The shipped serve_config.yaml's chat autoscaling (every model alike here, for a plain figure).
SHIPPED = PoolSpec(
    autoscaling_config=AutoscalingSpec(
        min_replicas=0,
        initial_replicas=0,
        max_replicas=2,
        target_ongoing_requests=8,
        upscale_delay_s=2,
        downscale_delay_s=120,
        downscale_to_zero_delay_s=300,
        look_back_period_s=2,
        metrics_interval_s=0.5,
    ),  # fmt: skip
    max_ongoing_requests=16,
    max_queued_requests=64,
)
SHIPPED_REGIONS = {
    "eu": {"lat": 50.1109, "lon": 8.6821},
    "us": {"lat": 39.0438, "lon": -77.4874},
    "ap": {"lat": 1.3521, "lon": 103.8198},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("plan")
    group.add_argument("--plan-requests", type=float, default=10e6, help="the scale day's requests")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def scale_day(requests: float) -> dict[str, Any]:
    """One day over 300 colos / 20 regions: the trace generated chunk by chunk as it is run."""
    rss_before = _peak_rss_mb()
    wall, cpu = time.perf_counter(), time.process_time()
    world = synthetic_world(300, 20, seed=0)
    trace = generate(TraceSpec(requests=requests, model_shares=MODELS, seed=1), world.origins)
    result = Simulator(world, dict.fromkeys(MODELS, SHIPPED), SimSettings()).run(trace)
    wall_s, cpu_s = time.perf_counter() - wall, time.process_time() - cpu
    figures = totals(result)
    return {
        "requests": figures["arrivals"],
        "colos": 300,
        "regions": 20,
        "wall_s": round(wall_s, 1),
        "cpu_s": round(cpu_s, 1),
        "us_per_request_cpu": round(cpu_s / max(1, figures["arrivals"]) * 1e6, 2),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
        "peak_rss_before_mb": round(rss_before, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "figures": figures,
    }


def prewarm_comparison(requests: float, shape: str) -> dict[str, Any]:
    """Two days on the shipped three regions, figures from the second (the forecaster's
    same-time-yesterday needs one): scale-to-zero, predictive pre-warming, always-warm."""
    world = World.with_colo_origins(EdgeConfig.model_validate({"regions": SHIPPED_REGIONS}))
    spec = TraceSpec(
        requests=requests, duration_s=2 * DAY_S, shape=shape, trough_ratio=0.0,  # type: ignore[arg-type]
        model_shares=MODELS, seed=2,
    )  # fmt: skip
    runs = compare(
        world,
        lambda: generate(spec, world.origins),
        dict.fromkeys(MODELS, SHIPPED),
        [scale_to_zero(), predictive(), always_warm()],
        SimSettings(measure_from_s=DAY_S),
    )
    zero, ahead, warm = (totals(result) for _, result in runs)
    out: dict[str, Any] = {"trace": shape, "requests_per_day": requests / 2}
    for name, figures in (("scale_to_zero", zero), ("predictive", ahead), ("always_warm", warm)):
        out[name] = {
            "cold_starts": figures["cold_starts"],
            "replica_h": round(figures["replica_s"] / 3600, 1),
            "hidden_vs_scale_to_zero": hidden_share(figures, zero),
            "extra_replica_s_vs_scale_to_zero": extra_replica_share(figures, zero),
            "replica_s_vs_always_warm": round(figures["replica_s"] / warm["replica_s"], 3),
            "p99_ms": figures["p99_ms"],
        }
    hidden = out["predictive"]["hidden_vs_scale_to_zero"]
    extra = out["predictive"]["extra_replica_s_vs_scale_to_zero"]
    out["met"] = hidden is not None and hidden >= HIDDEN_GOAL and extra <= EXTRA_COST_GOAL
    return out


def prewarm_goals(trace: str, compared: dict[str, Any]) -> dict[str, GoalRecord]:
    """Both halves of the pre-warming goal, on one trace: the share of scale-to-zero's cold
    starts hidden, and what it costs in replica-seconds over scale-to-zero."""
    predictive = compared["predictive"]
    return {
        f"prewarm_hidden_share_{trace}": goal(
            predictive["hidden_vs_scale_to_zero"], HIDDEN_GOAL, "share of cold starts hidden"
        ),
        f"prewarm_extra_replica_s_{trace}": goal(
            predictive["extra_replica_s_vs_scale_to_zero"],
            EXTRA_COST_GOAL,
            "share of scale-to-zero's replica-seconds",
            at_most=True,
        ),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    requests = 100_000 if args.quick else getattr(args, "plan_requests", 10e6)
    full_day = requests >= 10e6
    day = scale_day(requests)
    print(f"plan: scale day {json.dumps({k: v for k, v in day.items() if k != 'figures'})}",
          file=sys.stderr)  # fmt: skip
    prewarm_requests = 20_000 if args.quick else 80_000
    office = prewarm_comparison(prewarm_requests, "follow-the-sun")
    diurnal = prewarm_comparison(prewarm_requests, "diurnal")
    return {
        "scale_day": day,
        "prewarm_follow_the_sun": office,
        "prewarm_diurnal": diurnal,
        "goals": {
            "plan_day_10m_requests_300_colos_20_regions_s": goal(
                day["wall_s"] if full_day else None,
                SCALE_GOAL_S,
                "s wall",
                at_most=True,
                missing=f"a --quick run plans {int(requests)} requests, not the day",
                details={"cpu_s": day.get("cpu_s"), "peak_rss_mb": day.get("peak_rss_mb")},
            ),
            **prewarm_goals("follow_the_sun", office),
            **prewarm_goals("diurnal", diurnal),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plan_scale", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    add_arguments(parser)
    json.dump(run(parser.parse_args(argv)), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
