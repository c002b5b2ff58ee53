"""A simulation's figures as plain data: per region and model, per model, and per policy."""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_sim.plan.simulator import SimulationResult
from edge_sim.plan.stats import percentile_ms


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


def pool_rows(result: SimulationResult) -> list[dict[str, Any]]:
    """One row per (region, model): requests, p50/p99 (RTT included), cold-start share,
    replica-seconds, cost units, peak replicas, starts from zero, sheds of its home traffic."""
    rows = []
    for region in result.regions:
        for model in result.models:
            stats = result.pools[(model, region)]
            served = stats.requests
            rows.append(
                {
                    "region": region,
                    "model": model,
                    "requests": served,
                    "p50_ms": _round(percentile_ms(stats.histogram, 50)),
                    "p99_ms": _round(percentile_ms(stats.histogram, 99)),
                    "cold_starts": stats.cold,
                    "cold_share": round(stats.cold / served, 5) if served else 0.0,
                    "queued": stats.queued,
                    "replica_s": round(stats.replica_s, 1),
                    "cost_units": round(result.cost_units(model, region), 1),
                    "max_replicas": max((running for _, running, _ in stats.timeline), default=0),
                    "scale_from_zero": stats.scale_from_zero,
                    "sheds": result.sheds.get((model, region), 0),
                    "failed_attempts": result.failed_attempts.get((model, region), 0),
                }
            )
    return rows


def totals(result: SimulationResult) -> dict[str, Any]:
    """The whole run: requests, sheds, cold starts, replica-seconds, cost, p50/p99."""
    histogram = np.zeros(len(next(iter(result.pools.values())).histogram), dtype=np.int64)
    for stats in result.pools.values():
        histogram += np.asarray(stats.histogram)
    served = sum(s.requests for s in result.pools.values())
    cold = sum(s.cold for s in result.pools.values())
    return {
        "arrivals": result.arrivals,
        "served": served,
        "sheds": sum(result.sheds.values()),
        "cold_starts": cold,
        "cold_share": round(cold / served, 5) if served else 0.0,
        "replica_s": round(sum(s.replica_s for s in result.pools.values()), 1),
        "cost_units": round(sum(result.cost_units(m, r) for m, r in result.pools), 1),
        "p50_ms": _round(percentile_ms(histogram, 50)),
        "p99_ms": _round(percentile_ms(histogram, 99)),
        "scale_from_zero": sum(s.scale_from_zero for s in result.pools.values()),
        "route_computations": result.route_computations,
        "route_cache_hits": result.route_cache_hits,
        "wall_s": round(result.wall_s, 2),
    }


def hidden_share(policy: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    """The share of the baseline's cold starts the policy did not meet."""
    if not baseline["cold_starts"]:
        return None
    return round(1 - policy["cold_starts"] / baseline["cold_starts"], 4)


def extra_replica_share(policy: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    """Replica-seconds over the baseline's, as a share of it (0.25: 25% more)."""
    if not baseline["replica_s"]:
        return None
    return round(policy["replica_s"] / baseline["replica_s"] - 1, 4)
