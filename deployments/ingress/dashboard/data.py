"""What the dashboard page shows, assembled from plain values (no Starlette, no Ray): colos with
one display state each, regions with replicas running/wanted per model, and recent traffic.

Regions: when the router knows real regions (the `/admin/regions` payload) they are used as
they are; until then the whole cluster is one region, `cluster`, with Serve's replica counts.
This module is the one place to change when the regions' shape changes."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from deployments.observability.recent_traffic import summarize

ColoDisplayState = Literal["healthy", "degraded", "down"]
CLUSTER_REGION = "cluster"
# Serve's replica states that will be running once they are done: "wanted" counts them too.
STARTING_STATES = frozenset({"STARTING", "UPDATING", "RECOVERING", "PENDING_MIGRATION"})


def colo_display_state(colo: Mapping[str, Any], region_healthy: bool = True) -> ColoDisplayState:
    """A drill that takes the colo down (or a colo not active) wins; otherwise the colo shows
    its region's real health: "degraded" while a replica pool there is ejected."""
    down = any(fault["active"] and fault.get("down") for fault in colo.get("faults", []))
    if down or colo.get("status", "active") != "active":
        return "down"
    return "healthy" if region_healthy else "degraded"


def _drill(colo: Mapping[str, Any]) -> dict[str, Any] | None:
    """The colo's drill as the page shows it: what, and for how much longer."""
    active = [fault for fault in colo.get("faults", []) if fault["active"]]
    if not active:
        return None
    ends = [fault["ends_in_s"] for fault in active]
    return {
        "down": any(fault.get("down") for fault in active),
        "added_latency_ms": max(fault.get("added_latency_ms", 0) for fault in active),
        "error_rate": max(fault.get("error_rate", 0) for fault in active),
        "ends_in_s": None if None in ends else max(ends),
    }


def colo_view(colo: Mapping[str, Any], region_healthy: bool = True) -> dict[str, Any]:
    return {
        "id": colo["id"],
        "city": colo.get("city"),
        "country": colo.get("country"),
        "lat": colo["lat"],
        "lon": colo["lon"],
        "region": colo.get("region"),
        "state": colo_display_state(colo, region_healthy),
        "models": colo.get("models"),
        "drill": _drill(colo),
    }


@dataclass(frozen=True)
class ReplicaCount:
    running: int
    wanted: int


def replica_counts(replica_states: Mapping[str, int]) -> ReplicaCount:
    """From Serve's replica states of one deployment: running, and running + on the way."""
    running = int(replica_states.get("RUNNING", 0))
    starting = sum(int(n) for state, n in replica_states.items() if state in STARTING_STATES)
    return ReplicaCount(running, running + starting)


def cluster_region(
    models: Sequence[str], replica_states: Mapping[str, Mapping[str, int]]
) -> dict[str, Any]:
    """The one region of a router without real regions: the cluster, per model."""
    replicas = {}
    for model in models:
        count = replica_counts(replica_states.get(model, {}))
        replicas[model] = {"running": count.running, "wanted": count.wanted}
    return {"id": CLUSTER_REGION, "healthy": True, "replicas": replicas, "source": "serve"}


def regions_view(regions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Real regions (edge-control's /admin/regions payload, `RegionBoard.describe()` plus drills)
    in the page's shape. A region is healthy while no model's pool there is ejected or
    half-open: real request failures, not a counter of the router's."""
    views = []
    for region in regions:
        pools: Mapping[str, Mapping[str, Any]] = region.get("models") or {}
        views.append(
            {
                "id": str(region["region"]),
                "healthy": all(
                    (pool.get("health") or {}).get("state", "healthy") == "healthy"
                    for pool in pools.values()
                ),
                "replicas": {
                    model: {
                        "running": int(pool.get("replicas_running", 0)),
                        "wanted": int(pool.get("replicas_wanted", 0)),
                    }
                    for model, pool in pools.items()
                },
                "source": "regions",
            }
        )
    return views


def dashboard_data(
    *,
    now: float,
    colos: Sequence[Mapping[str, Any]],
    models: Sequence[str],
    replica_states: Mapping[str, Mapping[str, int]],
    traffic_snapshots: Iterable[Mapping[str, Any]],
    regions: Iterable[Mapping[str, Any]] | None = None,
    last_cold_start: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The page's whole payload, JSON-ready."""
    region_views = (
        regions_view(regions) if regions is not None else [cluster_region(models, replica_states)]
    )
    region_healthy = {region["id"]: region["healthy"] for region in region_views}
    return {
        "generated_at_unix": now,
        "models": list(models),
        "colos": [colo_view(colo, region_healthy.get(colo.get("region"), True)) for colo in colos],
        "regions": region_views,
        "last_cold_start": dict(last_cold_start or {}),
        **summarize(traffic_snapshots, now),
    }
