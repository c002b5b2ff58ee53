"""A Ray Serve deployment with no model: what a bare replica costs to start from zero replicas, the
baseline a model replica's cold start is compared with. It imports nothing heavy of ours on
purpose, and is woken the way a model is: by a handle call from an always-running ingress."""

from __future__ import annotations

import os
import time
from typing import Any

from ray.serve import Application
from ray.serve.handle import DeploymentHandle

# Only light modules of ours: the model servers' imports are the cost this replica must not pay.
from deployments.app import as_deployment
from deployments.ray_ext.router_metrics import sample_queue_before_push_at_zero
from deployments.replica.process import process_age_s

EMPTY_DEPLOYMENT = "empty"
EMPTY_INGRESS = "empty-ingress"


class EmptyReplica:
    """Answers every request with when it became ready and how old its process was then."""

    def __init__(self) -> None:
        self.process_s = process_age_s()
        self.ready_at = time.time()

    async def describe(self) -> dict[str, Any]:
        return {"replica_ready_at": self.ready_at, "process_s": self.process_s, "pid": os.getpid()}


class EmptyIngress:
    """The router's stand-in: one replica that forwards each request to `EmptyReplica` through a
    handle, so a request at zero replicas is queued (and reported) by a handle in a replica."""

    def __init__(self, replica: DeploymentHandle) -> None:
        sample_queue_before_push_at_zero()  # as the router does: the same controller decision
        self.replica = replica

    async def __call__(self, request: Any) -> dict[str, Any]:
        return await self.replica.describe.remote()


def build_empty_app(args: dict[str, Any]) -> Application:
    """`import_path: benchmarks.coldstart.empty:build_empty_app`; the Serve options come from the
    config's `deployments:` section, like the models'."""
    replica = as_deployment(EmptyReplica).options(name=EMPTY_DEPLOYMENT).bind()
    return as_deployment(EmptyIngress).options(name=EMPTY_INGRESS).bind(replica)
