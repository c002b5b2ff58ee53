"""`deployments.app:build_app` - the application behind serve_config.yaml: one deployment per
model (named after it, so the file's `deployments:` section overrides it by name), the router, and
`edge-control`, where the router replicas share fault drills."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray import serve
from ray.serve import Application

from deployments.config import AppConfig, ConfigError, parse_app_config
from deployments.edge_control import EdgeControl
from deployments.observability.environment import resolve_tracing_config
from deployments.runtime.session import SessionConfig
from deployments.servers.batched import EmbeddingServer, ModerationServer
from deployments.servers.chat import ChatServer
from deployments.warm_pool import WarmPool, warm_runtime_env

log = logging.getLogger("ray.serve")

SERVER_BY_TASK = {"chat": ChatServer, "embedding": EmbeddingServer, "moderation": ModerationServer}


def uses_gpu(config: AppConfig) -> bool:
    """`auto` asks the cluster; a cluster whose GPU nodes are scaled to zero shows no GPU, which
    is why the Kubernetes config says `gpu` explicitly."""
    if config.accelerator != "auto":
        return config.accelerator == "gpu"
    return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0


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
    # prestarted worker only to an actor with the same one (deployments.warm_pool).
    replica_env = {"runtime_env": warm_runtime_env()} if config.warm_pool.enabled else {}
    servers = {}
    for name, model in config.models.items():
        path = config.model_path(name)
        if not (path / "manifest.json").is_file():
            log.warning("%s: no model directory at %s yet (run `make models`)", name, path)
        actor_options: dict[str, Any] = {"num_cpus": model.num_cpus, **replica_env}
        if gpu:
            actor_options["num_gpus"] = model.num_gpus
        session = SessionConfig(
            provider="cuda" if gpu else "cpu", intra_op_threads=model.intra_op_threads
        )
        deployment = serve.deployment(SERVER_BY_TASK[model.task]).options(
            name=name, ray_actor_options=actor_options
        )
        servers[name] = deployment.bind(
            str(path),
            session,
            observability=observability.model_dump(mode="json"),
            model_name=name,
        )

    from deployments.router import RouterIngress  # FastAPI app: only where the router runs

    control = (
        serve.deployment(EdgeControl)
        .options(name="edge-control", num_replicas=1, ray_actor_options={"num_cpus": 0.01})
        .bind()
    )
    warm_pool = None
    if config.warm_pool.enabled:
        warm_pool = (
            serve.deployment(WarmPool)
            .options(
                name="warm-pool", num_replicas=1, ray_actor_options={"num_cpus": 0, **replica_env}
            )
            .bind(config.warm_pool.model_dump(mode="json"))
        )
    router = serve.deployment(RouterIngress).options(
        name="router", ray_actor_options={"num_cpus": config.router.num_cpus}
    )
    return router.bind(config.model_dump(mode="json"), servers, control, warm_pool)
