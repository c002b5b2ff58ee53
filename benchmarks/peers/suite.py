"""The peers suite: our app next to what a user would run instead, in one private Ray + Serve,
behind the same proxy, rounds interleaved so the shared machine's noise lands on both sides.

- embeddings: the docs-pattern PyTorch deployment (`@serve.batch(32, 5 ms)`), 1 and 32 clients;
- chat: `transformers` `generate()` per request on the same tiny GLM, 16 concurrent requests;
- TTFT of one stream vs one decode step + the router hop;
- router CPU per request, read from the router replicas' own processes.
Each ratio is reported next to its goal; a figure that cannot be computed is a miss that says so.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from benchmarks.cluster import apply_applications, serve_cluster
from benchmarks.peers import cpu
from benchmarks.peers.chat import bench_chat
from benchmarks.peers.common import PEER_CHAT, PEER_EMBEDDING, Clock
from benchmarks.peers.config import (
    INGRESS_ENV,
    SERVE_SWITCHES_ENV,
    Ingress,
    PeersBenchConfig,
    add_arguments,
)
from benchmarks.peers.decode_profile import decode_profile
from benchmarks.peers.embeddings import bench_embeddings
from benchmarks.peers.router_cpu import bench_router_cpu
from benchmarks.peers.verdicts import goals
from benchmarks.router import EDGE_APP, RouterBenchConfig, edge_application
from deployments.config import parse_app_config, without_regions

__all__ = ["add_arguments", "edge_app", "run", "run_peers_suite"]


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return run_peers_suite(PeersBenchConfig.from_args(args))


def run_peers_suite(config: PeersBenchConfig, clock: Clock = time.perf_counter) -> dict[str, Any]:
    base_url = f"http://127.0.0.1:{config.http_port}"
    edge = edge_app(config, yaml.safe_load(config.serve_config.read_text()))
    results: dict[str, Any] = {"config": config.model_dump(mode="json")}
    with (
        _ingress_env(config.ingress, config.http_port),
        serve_cluster(
            config.ray_num_cpus, config.http_port, SERVE_SWITCHES_ENV[config.serve_switches]
        ),
    ):
        apply_applications(
            [edge, *peer_applications(edge, config)], config.http_port, config.deploy_timeout_s
        )
        results["processes"] = _titles()
        results["embeddings"] = asyncio.run(bench_embeddings(config, base_url, clock))
        results["router_cpu"] = asyncio.run(bench_router_cpu(config, base_url))
        results["chat"] = asyncio.run(bench_chat(config, base_url, clock))
    glm = parse_app_config(edge["args"]).models["glm"]
    results["decode"] = decode_profile(
        config.models_dir / "glm", glm.intra_op_threads, config.decode_tokens
    )
    results["goals"] = goals(results)
    return results


def edge_app(config: PeersBenchConfig, serve_config: dict[str, Any]) -> dict[str, Any]:
    """Our application as shipped, one pool per model (the home region's: the router's and the
    model's cost, not the regions'), with the shipped embedding batching."""
    shipped = without_regions(serve_config, home="eu")
    edge = edge_application(shipped, RouterBenchConfig(models_dir=config.models_dir), 32)
    # The shipped embedding batch size, not the router suite's override.
    edge = _shipped_batching(edge, shipped)
    if config.router_replicas is not None:
        (router,) = [d for d in edge["deployments"] if d["name"] == "router"]
        router["num_replicas"] = config.router_replicas
    return edge


@contextmanager
def _ingress_env(ingress: Ingress, http_port: int) -> Iterator[None]:
    """The switches must be in the environment Ray's processes inherit from this driver."""
    changes = dict(INGRESS_ENV[ingress])
    if ingress != "proxy":
        # Replicas that take HTTP themselves bind ports from a range (30000+ by default, which
        # another Serve on the machine may hold): ours sit just above our own HTTP port.
        changes |= {
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(http_port + 100),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(http_port + 199),
            "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(http_port + 200),
            "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(http_port + 299),
        }
    if ingress == "haproxy":
        # Per-run paths: Serve's defaults under /tmp/haproxy-serve would collide with any other
        # HAProxy-fronted Serve on the machine.
        state = f"/tmp/haproxy-serve-{os.getpid()}"
        changes |= {
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{state}/haproxy.cfg",
            "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{state}/admin.sock",
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": state,
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{state}/server-state",
        }
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _shipped_batching(edge: dict[str, Any], shipped: dict[str, Any]) -> dict[str, Any]:
    (app,) = [a for a in shipped["applications"] if a["name"] == EDGE_APP]
    user_configs = {d["name"]: d.get("user_config") for d in app["deployments"]}
    for deployment in edge["deployments"]:
        if deployment["name"] == "embedding":
            deployment["user_config"] = user_configs["embedding"]
    return edge


def peer_applications(edge: dict[str, Any], config: PeersBenchConfig) -> list[dict[str, Any]]:
    """The peers get what our model deployments get: CPU share, threads, max_ongoing_requests;
    only the serving code differs."""
    app_config = parse_app_config(edge["args"])
    options = {d["name"]: d for d in edge["deployments"]}
    module = "benchmarks.peers.apps"

    def peer(
        spec: tuple[str, str, str], builder: str, ours: str, model_dir: Path
    ) -> dict[str, Any]:
        name, route, deployment = spec
        model = app_config.models[ours]
        return {
            "name": name,
            "route_prefix": route,
            "import_path": f"{module}:{builder}",
            "args": {"model_dir": str(model_dir), "torch_threads": max(1, model.intra_op_threads)},
            "deployments": [
                {
                    "name": deployment,
                    "num_replicas": 1,
                    "max_ongoing_requests": options[ours]["max_ongoing_requests"],
                    "ray_actor_options": {"num_cpus": model.num_cpus},
                }
            ],
        }

    return [
        peer(
            PEER_EMBEDDING, "build_docs_embedding", "embedding", app_config.model_path("embedding")
        ),
        peer(PEER_CHAT, "build_docs_chat", "glm", app_config.model_path("glm")),
    ]


def _titles() -> dict[str, int]:
    """The Ray workers of this private cluster by title: which replicas the CPU figures read."""
    counts: dict[str, int] = {}
    for info in cpu.descendants(os.getpid(), cpu.processes()):
        if info.title.startswith("ray::"):
            title = info.title.split()[0]
            counts[title] = counts.get(title, 0) + 1
    return dict(sorted(counts.items()))
