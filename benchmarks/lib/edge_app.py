"""Our application as the served suites deploy it: serve_config.yaml's, one pool per model (the
home region's: the router's and the model's cost, not the regions'), on the CPU, with no
simulated RTT and one fixed replica per model."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from benchmarks.lib.config import ServedBenchConfig
from deployments.config import parse_app_config
from deployments.serve_file import set_router_listener, without_regions

EDGE_APP = "edge"
HOME_REGION = "eu"

# The router's response cache would answer repeated bodies without calling the model: every
# request says bypass, except those timing a cache hit on purpose.
BYPASS_CACHE: Mapping[str, str] = {"x-edge-cache": "bypass"}


def shipped_config(serve_config: Path) -> dict[str, Any]:
    """serve_config.yaml with one pool per model (the home region's)."""
    return without_regions(yaml.safe_load(serve_config.read_text()), home=HOME_REGION)


def edge_application(
    shipped: Mapping[str, Any],
    models_dir: Path,
    *,
    embedding_batch_size: int | None = None,
    router_replicas: int | None = None,
) -> dict[str, Any]:
    """`shipped`'s (see shipped_config) edge application, except: CPU, our models directory, no
    simulated RTT, one fixed replica per model (an autoscaler adding one mid-run would change
    what is measured) and, when given, the embedding batch size and router replicas under test.
    The router keeps its shipped replica count otherwise."""
    (app,) = [copy.deepcopy(a) for a in shipped["applications"] if a["name"] == EDGE_APP]
    args = app["args"]
    args["accelerator"] = "cpu"
    args["models_dir"] = str(models_dir)
    # The router sleeps each request's simulated RTT on purpose; that is the network being
    # acted out, not router overhead, so it is off here.
    args.setdefault("edge", {}).setdefault("latency", {})["real_delay_scale"] = 0
    set_router_listener(args, None)
    for deployment in app.get("deployments", []):
        if deployment.pop("autoscaling_config", None) is not None:
            deployment["num_replicas"] = 1
        if deployment["name"] == "embedding" and embedding_batch_size is not None:
            user_config = deployment.get("user_config") or {}
            deployment["user_config"] = {**user_config, "max_batch_size": embedding_batch_size}
        if deployment["name"] == "router" and router_replicas is not None:
            deployment["num_replicas"] = router_replicas
    return app


def deployment_options(edge: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each deployment's Serve options by name, for a baseline that stands in for it."""
    return {d["name"]: {k: v for k, v in d.items() if k != "name"} for d in edge["deployments"]}


def our_application(
    config: ServedBenchConfig, *, embedding_batch_size: int | None = None
) -> dict[str, Any]:
    """The edge application of `config`'s serve config, with its router replicas (and their
    own port, with ingress `router`)."""
    app = edge_application(
        shipped_config(config.serve_config),
        config.models_dir,
        embedding_batch_size=embedding_batch_size,
        router_replicas=config.router_replicas,
    )
    set_router_listener(app["args"], config.listener_port)
    return app


def our_url(config: ServedBenchConfig, proxy_url: str) -> str:
    """Where a client reaches our application: the routers' own port when the suite runs with
    one, else Serve's proxy (where the peers deployed beside ours are reached)."""
    if config.listener_port is None:
        return proxy_url
    return f"http://127.0.0.1:{config.listener_port}"


def peer_application(
    edge: Mapping[str, Any], ours: str, *, name: str, route: str, builder: str, deployment: str
) -> dict[str, Any]:
    """A peer standing in for our model `ours`, as a user deploys it: one replica with Serve's
    default CPU share and torch's default threads (nothing pinned to our deployment's), and our
    deployment's max_ongoing_requests (so a batch can fill as ours can). `builder` is its
    application builder's import path, called with the model directory."""
    app_config = parse_app_config(edge["args"])
    return {
        "name": name,
        "route_prefix": route,
        "import_path": builder,
        "args": {"model_dir": str(app_config.model_path(ours))},
        "deployments": [
            {
                "name": deployment,
                "num_replicas": 1,
                "max_ongoing_requests": deployment_options(edge)[ours]["max_ongoing_requests"],
            }
        ],
    }
