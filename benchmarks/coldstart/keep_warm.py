"""Pre-warming measured: a keep-warm window (deployments.control.keep_warm) opens on a model at zero
replicas with no traffic; how long until its replica runs, and what the first request after that
costs next to a cold one measured in the same run."""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from benchmarks.coldstart.cluster import replica_states
from benchmarks.coldstart.probe import ColdTarget, wait_for_zero
from benchmarks.lib.cluster import apply_applications
from deployments.control.keep_warm import KEEP_WARM_POLICY
from edgectl.local_cluster import wait_until

WINDOW_LENGTH = timedelta(minutes=10)


def with_keep_warm(edge: Mapping[str, Any], deployment: str, opens: datetime) -> dict[str, Any]:
    """The edge application with a one-replica window on `deployment` from `opens` (UTC)."""
    scheduled = copy.deepcopy(dict(edge))
    (options,) = [d for d in scheduled["deployments"] if d["name"] == deployment]
    window = {
        "start": opens.strftime("%H:%M:%S"),
        "end": (opens + WINDOW_LENGTH).strftime("%H:%M:%S"),
        "timezone": "UTC",
        "replicas": 1,
    }
    options["autoscaling_config"]["policy"] = {
        "policy_function": KEEP_WARM_POLICY,
        "policy_kwargs": {"windows": [window]},
    }
    return scheduled


def run_keep_warm(
    client: httpx.Client,
    target: ColdTarget,
    applications: Sequence[dict[str, Any]],
    http_port: int,
    timeout_s: float,
    lead_s: float,
) -> dict[str, Any]:
    """Deploy a window opening `lead_s` from now (time enough for the deploy to apply first),
    time the replica from the window's opening, send one request, then deploy `applications`
    back as they were. `applications[0]` is the edge application."""
    edge, *others = applications
    wait_for_zero([target], timeout_s)
    opens = datetime.now(UTC) + timedelta(seconds=lead_s)
    apply_applications(
        [with_keep_warm(edge, target.deployment, opens), *others], http_port, timeout_s
    )
    try:
        if datetime.now(UTC) >= opens or _replicas(target):
            return {"error": f"the deploy took longer than the {lead_s} s lead: nothing measured"}
        wait_until(
            lambda: replica_states(target.app, target.deployment).get("RUNNING", 0) >= 1,
            timeout_s,
            f"a {target.deployment} replica in its keep-warm window",
            every_s=0.05,
        )
        running_after_s = (datetime.now(UTC) - opens).total_seconds()
        sent = time.perf_counter()
        response = client.post(target.path, json=dict(target.body))
        first_response_s = time.perf_counter() - sent
        response.raise_for_status()
    finally:
        apply_applications(list(applications), http_port, timeout_s)
    return {
        "model": target.deployment,
        "window_open_to_running_s": round(running_after_s, 3),
        "first_response_s": round(first_response_s, 4),
        "first_response_was_cold": response.headers.get("x-edge-cold-start") == "1",
    }


def _replicas(target: ColdTarget) -> int:
    return sum(replica_states(target.app, target.deployment).values())
