"""The warm pool (deployments.control.warm_pool) measured against no pool in the same run: a second
copy of the edge application with `warm_pool.enabled: false` under its own route prefix, so cycles
of the two alternate under the same machine load.

History: a first experiment warmed workers by running an importing *task* in them; Ray 2.60 never
gave such a worker to a replica (a worker that ran a task is an actor-less worker of that job),
only never-used ones. The pool asks each raylet for never-used workers instead."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import httpx

NO_POOL_APP = "edge-no-warm-pool"
NO_POOL_ROUTE = "/no-warm-pool"


def no_warm_pool_application(edge: Mapping[str, Any]) -> dict[str, Any]:
    """The bench's edge application without the pool, at `NO_POOL_ROUTE`."""
    app = copy.deepcopy(dict(edge))
    app["name"], app["route_prefix"] = NO_POOL_APP, NO_POOL_ROUTE
    app["args"]["warm_pool"] = {**app["args"].get("warm_pool", {}), "enabled": False}
    return app


def idle_warm_workers(client: httpx.Client, readyz_path: str = "/readyz") -> int | None:
    """Idle workers the pool holds, all nodes together (None: the application has no pool)."""
    pool = client.get(readyz_path).json().get("warm_pool")
    if not pool:
        return None
    return sum(len(node["idle"]) for node in pool["nodes"].values())


def pool_target(client: httpx.Client) -> int:
    """How many idle workers a full pool holds (per node times nodes it tops up)."""
    pool = client.get("/readyz").json().get("warm_pool") or {}
    return int(pool.get("workers_per_node", 0)) * max(1, len(pool.get("nodes", {})))
