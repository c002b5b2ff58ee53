"""The shipped serve_config.yaml cut down for a cluster on one machine: a few models, one replica
per region at most, kept for 10 minutes, the moderation gate off, RTT reported but not slept,
and an unlimited API key for load. Used by the region tests and the chaos scenario."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from deployments.serve_file import serve_only, set_router_listener

LOAD_KEY_NAME = "load"  # the key name (EDGE_API_KEYS "load:<key>") that has no rate limits


def regional_config(
    serve_config: Path,
    models_root: Path,
    http_port: int,
    models: Mapping[str, Mapping[str, int]],
    deployment_options: Mapping[str, Any] | None = None,
    ingress_resource: str | None = None,
) -> dict[str, Any]:
    """`serve_config` serving only `models` ({model: {region: initial replicas}})."""
    config = yaml.safe_load(serve_config.read_text())
    config["http_options"] = {"host": "127.0.0.1", "port": http_port}
    app = config["applications"][0]
    args = app["args"]
    args["models_dir"] = str(models_root)
    serve_only(args, models)
    set_router_listener(args, None)
    args["security"]["moderation_gate"]["models"] = []
    args["security"]["per_key"] = {
        LOAD_KEY_NAME: {"requests_per_minute": None, "tokens_per_minute": None}
    }
    args["edge"]["latency"]["real_delay_scale"] = 0
    if ingress_resource is not None:
        args["edge"]["region_policy"]["ingress_resource"] = ingress_resource
    deployments = []
    for deployment in app["deployments"]:
        model, _, region = deployment["name"].rpartition("-")
        if model in models:
            deployment = copy.deepcopy(deployment)
            scaling = deployment["autoscaling_config"]
            scaling.update(max_replicas=1, initial_replicas=models[model][region])
            scaling.update(downscale_delay_s=600, downscale_to_zero_delay_s=600)
            deployment.update((deployment_options or {}).get(model, {}))
            deployments.append(deployment)
        elif deployment["name"] == "router":
            deployments.append(deployment)
    app["deployments"] = deployments
    return config
