"""The two serve configs the at-rest suite runs: a temp copy of serve_config.yaml (our models/,
its own state folder and ports, everything else as shipped) and Ray Serve's hello world."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from deployments.serve_file import set_router_listener

HELLO_APP = "hello"
HELLO_IMPORT_PATH = "benchmarks.atrest.hello:app"
LOCALHOST = "127.0.0.1"


def ours(
    shipped: Mapping[str, Any],
    models_dir: Path,
    data_dir: Path,
    http_port: int,
    listener_port: int,
    idle_delay_s: float | None,
) -> dict[str, Any]:
    """The shipped config on ports of its own (the same front, another number: the machine may
    run another copy) and, with `idle_delay_s`, every model's downscale delays shortened."""
    config = copy.deepcopy(dict(shipped))
    config["http_options"] = {**config.get("http_options", {}), "host": LOCALHOST}
    config["http_options"]["port"] = http_port
    for app in config["applications"]:
        args = app["args"]
        args["models_dir"] = str(models_dir)
        args["data_dir"] = str(data_dir)
        if args.get("router", {}).get("listener", {}).get("enabled"):
            set_router_listener(args, listener_port)
        if idle_delay_s is None:
            continue
        for deployment in app.get("deployments", []):
            if "autoscaling_config" in deployment:
                _set_idle_delay(deployment, idle_delay_s)
    return config


def set_model_idle_delay(config: Mapping[str, Any], model: str, idle_delay_s: float) -> None:
    """`model`'s pools (every region's) back to zero `idle_delay_s` after their last request."""
    for deployment in model_deployments(config, model):
        _set_idle_delay(deployment, idle_delay_s)


def model_deployments(config: Mapping[str, Any], model: str) -> list[dict[str, Any]]:
    """The model's autoscaled deployments: `<model>` alone, or one `<model>-<region>` a region."""
    (app,) = config["applications"]
    return [
        d
        for d in app.get("deployments", [])
        if "autoscaling_config" in d and d["name"] in (model, *_regional(app, model))
    ]


def _regional(app: Mapping[str, Any], model: str) -> list[str]:
    regions = app["args"].get("edge", {}).get("regions") or {}
    return [f"{model}-{region}" for region in regions]


def _set_idle_delay(deployment: dict[str, Any], idle_delay_s: float) -> None:
    scaling = deployment["autoscaling_config"]
    scaling["downscale_delay_s"] = idle_delay_s
    scaling["downscale_to_zero_delay_s"] = idle_delay_s


def hello_world(http_port: int) -> dict[str, Any]:
    """Ray Serve's hello world as its docs start it: no controller_options, Serve's defaults."""
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": LOCALHOST, "port": http_port},
        "applications": [
            {"name": HELLO_APP, "route_prefix": "/", "import_path": HELLO_IMPORT_PATH}
        ],
    }


def scale_to_zero_deployments(config: Mapping[str, Any]) -> dict[str, list[str]]:
    """Per application, the deployments that go to zero replicas when idle (the models)."""
    return {
        app["name"]: [
            d["name"]
            for d in app.get("deployments", [])
            if d.get("autoscaling_config", {}).get("min_replicas") == 0
        ]
        for app in config["applications"]
    }


def longest_idle_delay_s(config: Mapping[str, Any]) -> float:
    """The longest wait, after its last request, before a model is at zero."""
    delays = [
        max(
            scaling.get("downscale_delay_s", 0.0),
            scaling.get("downscale_to_zero_delay_s", 0.0),
        )
        for app in config["applications"]
        for d in app.get("deployments", [])
        if (scaling := d.get("autoscaling_config"))
    ]
    return float(max(delays, default=0.0))
