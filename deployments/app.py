"""`deployments.app:build_app` - the application behind serve_config.yaml: one deployment per
model and region (`glm-eu`; just `glm` without regions, so the file's `deployments:` section
overrides them by name), the router, and `edge-control`, where routers and replicas share the
regions' state and fault drills."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from pydantic import BaseModel
from ray import serve
from ray.serve import Application
from ray.serve.deployment import Deployment

from deployments.config import AppConfig, ConfigError, parse_app_config
from deployments.contracts.session_config import SessionConfig
from deployments.contracts.session_router import SessionAffinityRouter
from deployments.control.edge_control import EdgeControl
from deployments.control.front_spare import FrontSpare
from deployments.control.warm_pool import WarmPool, warm_runtime_env
from deployments.observability.environment import resolve_tracing_config
from deployments.ray_ext.haproxy_front import HEAD_NODE_RESOURCE
from deployments.replica.batched import EmbeddingServer, ModerationServer
from deployments.replica.chat import ChatServer
from edge_sim.regions import ROUTER_DEPLOYMENT, deployment_name, region_resource

log = logging.getLogger("ray.serve")

SERVER_BY_TASK = {"chat": ChatServer, "embedding": EmbeddingServer, "moderation": ModerationServer}
# A replica's claim on its region's node resource: tiny, so it only pins the replica to the
# region's nodes (`ray start --resources '{"region:eu": 100}'`) and never limits how many fit.
REGION_SHARE = 0.01


def uses_gpu(config: AppConfig) -> bool:
    """`auto` asks the cluster; a cluster whose GPU nodes are scaled to zero shows no GPU, which
    is why the Kubernetes config says `gpu` explicitly."""
    if config.accelerator != "auto":
        return config.accelerator == "gpu"
    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0


def uses_region_nodes(config: AppConfig) -> bool:
    """Pin each region's replicas to nodes carrying its `region:<name>` resource? `auto`: when
    the cluster has any such node now (on one node without them, regions share it)."""
    placement = config.edge.region_policy.placement
    if config.edge.regions is None or placement == "shared":
        return False
    if placement == "node_resource":
        return True
    return ray.is_initialized() and any(
        name.startswith(region_resource("")) for name in ray.cluster_resources()
    )


def build_app(args: dict[str, Any]) -> Application:
    config = parse_app_config(args)
    # OTEL_* and EDGE_TRACES_FILE are read here, where `serve run` starts: replicas on any node
    # get the result (a bad value stops `serve run` with a ConfigError naming the variable).
    try:
        tracing = resolve_tracing_config(config.observability.tracing, os.environ)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    observability = config.observability.model_copy(update={"tracing": tracing})
    config = config.model_copy(update={"observability": observability})
    gpu = uses_gpu(config)
    # Model replicas and the warm pool's idle workers share one runtime_env: the raylet hands a
    # prestarted worker only to an actor with the same one (deployments.control.warm_pool).
    replica_env = {"runtime_env": warm_runtime_env()} if config.warm_pool.enabled else {}
    pinned = uses_region_nodes(config)
    regions = config.edge.region_names
    policy = config.edge.region_policy
    ingress_options: dict[str, Any] = {}
    if policy.ingress_resource is not None:
        ingress_options["resources"] = {policy.ingress_resource: REGION_SHARE}
    control = (
        as_deployment(EdgeControl)
        .options(
            name="edge-control",
            num_replicas=1,
            # Every model replica holds one long poll here for its region's drills.
            max_ongoing_requests=10_000,
            ray_actor_options={"num_cpus": 0.01, **ingress_options},
            # Its calls are the platform's own (syncs, long polls), not users' requests: no
            # access log line per call (the routers log what users asked).
            logging_config={"enable_access_log": False},
        )
        .bind(
            {m: {r: deployment_name(m, r) for r in regions} for m in config.models},
            policy.model_dump(mode="json"),
            config.router.default_cold_start_ms,
            prewarm=config.edge.prewarm.model_dump(mode="json"),
        )
    )
    servers: dict[str, dict[str, Any]] = {}
    for name, model in config.models.items():
        path = config.model_path(name)
        if not (path / "manifest.json").is_file():
            log.warning("%s: no model directory at %s yet (run `make models`)", name, path)
        session = SessionConfig(
            provider="cuda" if gpu else "cpu", intra_op_threads=model.intra_op_threads
        )
        servers[name] = {}
        for region in regions:
            actor_options: dict[str, Any] = {"num_cpus": model.num_cpus, **replica_env}
            if gpu:
                actor_options["num_gpus"] = model.num_gpus
            if pinned:
                actor_options["resources"] = {region_resource(region): REGION_SHARE}
            deployment = as_deployment(SERVER_BY_TASK[model.task]).options(
                name=deployment_name(name, region), ray_actor_options=actor_options
            )
            if model.task == "chat":  # a session's requests to one replica: its prefix cache
                deployment = deployment.options(
                    request_router_config={
                        "request_router_class": f"{SessionAffinityRouter.__module__}."
                        f"{SessionAffinityRouter.__qualname__}"
                    }
                )
            servers[name][region] = deployment.bind(
                str(path),
                session,
                observability=observability.model_dump(mode="json"),
                model_name=name,
                region=region,
                control=control,
            )

    from deployments.ingress.router import RouterIngress  # FastAPI app: only where the router runs

    warm_pool = None
    if config.warm_pool.enabled:
        warm_pool = helper_deployment(
            WarmPool, "warm-pool", config.warm_pool, {**replica_env, **ingress_options}
        )
    front_spare = None
    if config.front_spare.enabled:
        # Beside Serve's HAProxy: the head node has one, whatever the proxy_location.
        on_head = {"resources": {HEAD_NODE_RESOURCE: 0.001}}
        front_spare = helper_deployment(FrontSpare, "front-spare", config.front_spare, on_head)
    router = as_deployment(RouterIngress).options(
        name=ROUTER_DEPLOYMENT,
        ray_actor_options={"num_cpus": config.router.num_cpus, **ingress_options},
    )
    return router.bind(config.model_dump(mode="json"), servers, control, warm_pool, front_spare)


def helper_deployment(
    cls: type, name: str, settings: BaseModel, actor_options: dict[str, Any]
) -> Application:
    """One of the platform's own helpers: one replica, no CPU, `settings` its one argument, no
    access log line per call (its calls are the platform's, not users' requests)."""
    return (
        as_deployment(cls)
        .options(
            name=name,
            num_replicas=1,
            ray_actor_options={"num_cpus": 0, **actor_options},
            logging_config={"enable_access_log": False},
        )
        .bind(settings.model_dump(mode="json"))
    )


def as_deployment(cls: type) -> Deployment:
    """`serve.deployment(cls)`, typed: Ray 2.60 annotates `serve.deployment` as returning the
    decorator factory even when it is given the class."""
    return serve.deployment(cls)  # type: ignore[return-value]
