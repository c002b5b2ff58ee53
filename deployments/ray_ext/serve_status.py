"""Serve's public `serve.status()`, one call at a time, and the RUNNING replicas it reports.

Ray Serve 2.60's `serve.status()` is not thread-safe: it validates the controller's details with
pydantic, and each deployment's `autoscaling_config` then builds a default `AutoscalingPolicy`,
which registers `ray.serve.autoscaling_policy` with cloudpickle "by value" and unregisters it
again. That registry is one set per process: two threads in there at once, and the second
unregister raises `ValueError: <module 'ray.serve.autoscaling_policy'> is not registered for
pickle by value` (seen live in edge-control, whose reads ran in worker threads). A lock makes the
calls in this process take turns; the canary test shows the registration still happens.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.serve.schema import ServeStatus

# Guards cloudpickle's process-wide by-value registry, so it is process-wide too.
_STATUS_LOCK = threading.Lock()


@dataclass(frozen=True)
class ReplicaCounts:
    running: Mapping[str, int]  # RUNNING replicas per deployment Serve has
    settling: frozenset[str]  # deployments with a replica starting, stopping or not yet healthy


def serve_status() -> ServeStatus:
    """`serve.status()`, never in two threads of this process at once. Blocking."""
    from ray import serve

    with _STATUS_LOCK:
        return serve.status()


def running_replicas(app: str) -> ReplicaCounts:
    """RUNNING replicas of each deployment of application `app`, and which are settling.
    Blocking: call it from a worker thread. Raises LookupError for an unknown application."""
    from ray.serve.schema import DeploymentStatus, ReplicaState

    status = serve_status()
    application = status.applications.get(app)
    if application is None:
        raise LookupError(f"Serve has no application {app!r} (has {sorted(status.applications)})")
    deployments = application.deployments
    return ReplicaCounts(
        running={
            name: deployment.replica_states.get(ReplicaState.RUNNING, 0)
            for name, deployment in deployments.items()
        },
        settling=frozenset(
            name
            for name, deployment in deployments.items()
            if deployment.status != DeploymentStatus.HEALTHY
            or any(state != ReplicaState.RUNNING for state in deployment.replica_states)
        ),
    )
