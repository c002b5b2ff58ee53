"""The cold-start suite's bench variant of serve_config.yaml: scale-to-zero within seconds, so a
model can be cycled zero -> first response -> zero quickly (the cluster: benchmarks.lib.cluster)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from benchmarks.coldstart.empty import EMPTY_DEPLOYMENT, EMPTY_INGRESS
from deployments.config import parse_app_config
from deployments.serve_file import serve_only, set_router_listener

log = logging.getLogger(__name__)

EDGE_APP = "edge"
EMPTY_APP = "coldstart-empty"
EMPTY_ROUTE = "/coldstart-empty"
ROUTER = "router"
CONTROL_LOOP_ENV_VAR = "RAY_SERVE_CONTROL_LOOP_INTERVAL_S"  # read by Serve's controller
SERVE_CONTROL_LOOP_S = 0.1  # Ray Serve 2.60's default


class ServeVariant(BaseModel):
    """What differs between the configurations the suite compares; the defaults are
    serve_config.yaml as shipped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics_interval: Literal["shipped", "default"] = Field(
        default="shipped",
        description="shipped: the autoscaling_config's metrics_interval_s (how often handles and "
        "replicas push autoscaling metrics); default: none, Ray Serve's 10 s",
    )
    runtime_env: Literal["app", "none"] = Field(
        default="app", description="app: serve_config.yaml's runtime_env; none: no runtime_env"
    )
    ray_env: dict[str, str] = Field(
        default_factory=dict, description="RAY_* variables for the raylet (worker pool settings)"
    )
    control_loop_s: float | None = Field(
        default=None,
        gt=0,
        description="None: serve_config.yaml's controller_options as shipped; a value: the "
        "controller's control loop interval instead (Ray Serve's default: 0.1 s)",
    )

    def controller_options(self, shipped: Mapping[str, Any]) -> dict[str, Any] | None:
        """What Serve's controller starts with: `shipped`'s top-level controller_options, or
        only the control loop interval of this variant."""
        options = copy.deepcopy(shipped.get("controller_options")) or {}
        if self.control_loop_s is None:
            return options or None
        env_vars = options.setdefault("runtime_env", {}).setdefault("env_vars", {})
        env_vars[CONTROL_LOOP_ENV_VAR] = str(self.control_loop_s)
        return options

    def control_loop_interval_s(self, shipped: Mapping[str, Any]) -> float:
        env = ((self.controller_options(shipped) or {}).get("runtime_env") or {}).get("env_vars")
        return float((env or {}).get(CONTROL_LOOP_ENV_VAR, SERVE_CONTROL_LOOP_S))


class BenchScaling(BaseModel):
    """The bench-only autoscaling: start at zero and drop back to zero a second after the last
    request, so each cycle measures a real cold start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_replicas: int = Field(default=2, ge=1)
    downscale_delay_s: float = Field(default=1.0, ge=0)
    downscale_to_zero_delay_s: float = Field(default=1.0, ge=0)
    # A stopping replica polls for in-flight requests every this often (Serve's default: 2 s)
    # before it exits; an idle one has none, so the bench does not wait the default out.
    graceful_shutdown_wait_loop_s: float = Field(default=0.2, gt=0)

    def apply(self, autoscaling: Mapping[str, Any], variant: ServeVariant) -> dict[str, Any]:
        scaled = {
            **autoscaling,
            "min_replicas": 0,
            "initial_replicas": 0,
            "max_replicas": self.max_replicas,
            "downscale_delay_s": self.downscale_delay_s,
            "downscale_to_zero_delay_s": self.downscale_to_zero_delay_s,
        }
        if variant.metrics_interval == "default":
            scaled.pop("metrics_interval_s", None)
        return scaled


def edge_application(
    shipped: Mapping[str, Any],
    models_dir: str,
    models: Sequence[str],
    scaling: BenchScaling,
    variant: ServeVariant,
) -> dict[str, Any]:
    """serve_config.yaml's edge application with only `models`, on CPU, without the simulated
    RTT sleep, the response cache and the moderation gate off (every request reaches its model
    and only it), one router replica and bench scaling."""
    (app,) = [copy.deepcopy(a) for a in shipped["applications"] if a["name"] == EDGE_APP]
    args = app["args"]
    args["accelerator"] = "cpu"
    args["models_dir"] = models_dir
    set_router_listener(args, None)
    serve_only(args, models)
    args.setdefault("edge", {}).setdefault("latency", {})["real_delay_scale"] = 0
    args.setdefault("router", {})["cache"] = {"enabled": False}
    gate = args.get("security", {}).get("moderation_gate")
    if gate is not None:
        # A gated chat request would wake the moderation model too: one model per cold start.
        gate["models"] = []
    kept = []
    for deployment in app.get("deployments", []):
        if deployment["name"] not in (*models, ROUTER):
            continue
        if "autoscaling_config" in deployment:
            deployment["autoscaling_config"] = scaling.apply(
                deployment["autoscaling_config"], variant
            )
            deployment["graceful_shutdown_wait_loop_s"] = scaling.graceful_shutdown_wait_loop_s
        if deployment["name"] == ROUTER:
            # /readyz reports the cold starts its own replica saw: with one router, all of them.
            deployment["num_replicas"] = 1
        kept.append(deployment)
    app["deployments"] = kept
    return _with_runtime_env(app, variant)


def empty_application(edge: Mapping[str, Any], like: str, variant: ServeVariant) -> dict[str, Any]:
    """The model-less baseline with the Serve options of model `like` (autoscaling, CPU share)
    and the edge application's runtime_env, behind an ingress with the router's: only the model
    differs."""
    options = {d["name"]: d for d in edge["deployments"]}
    model_options = {k: v for k, v in options[like].items() if k not in ("name", "user_config")}
    router_options = {k: v for k, v in options[ROUTER].items() if k != "name"}
    app_config = parse_app_config(edge["args"])
    app = {
        "name": EMPTY_APP,
        "route_prefix": EMPTY_ROUTE,
        "import_path": "benchmarks.coldstart.empty:build_empty_app",
        "args": {},
        "deployments": [
            {
                "name": EMPTY_DEPLOYMENT,
                **model_options,
                "ray_actor_options": {"num_cpus": app_config.models[like].num_cpus},
            },
            {
                "name": EMPTY_INGRESS,
                **router_options,
                "ray_actor_options": {"num_cpus": app_config.router.num_cpus},
            },
        ],
    }
    if "runtime_env" in edge:
        app["runtime_env"] = copy.deepcopy(edge["runtime_env"])
    return app


def _with_runtime_env(app: dict[str, Any], variant: ServeVariant) -> dict[str, Any]:
    if variant.runtime_env == "none":
        app.pop("runtime_env", None)
    return app


def replica_states(app: str, deployment: str) -> dict[str, int]:
    """Replicas of one deployment by state (STARTING, RUNNING, STOPPING, ...)."""
    status = serve.status().applications[app].deployments[deployment]
    return {str(getattr(state, "value", state)): n for state, n in status.replica_states.items()}
