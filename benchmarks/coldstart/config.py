"""The cold-start suite's settings: which models, how many cycles, which Serve and warm-pool
variants to compare, and the command-line flags that set them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Self

from pydantic import Field

from benchmarks.coldstart.cluster import (
    BenchScaling,
    ServeVariant,
)
from benchmarks.lib.config import BenchConfig
from deployments.config import PROJECT_ROOT

MODELS = ("glm", "kimi", "embedding", "moderation")


class ColdStartBenchConfig(BenchConfig):
    QUICK = {
        "cycles": 2,
        "models": ("glm", "moderation"),
        "in_process_repetitions": 1,
        "import_repetitions": 0,  # the fresh-interpreter import timing alone takes ~10 s
        "upscale_repetitions": 1,
    }

    serve_config: Path = PROJECT_ROOT / "serve_config.yaml"
    models: tuple[str, ...] = MODELS
    cycles: int = Field(default=5, ge=1, description="cold starts per model (and empty replica)")
    http_port: int = Field(default=8124, ge=1024, le=65535)
    ray_num_cpus: int = Field(default=4, ge=1)
    deploy_timeout_s: float = Field(default=240, gt=0)
    cycle_timeout_s: float = Field(default=120, gt=0)
    in_process_repetitions: int = Field(default=3, ge=1)
    import_repetitions: int = Field(default=3, ge=0, description="0 skips the import timing")
    variant: ServeVariant = ServeVariant()
    scaling: BenchScaling = BenchScaling()
    upscale_model: str | None = Field(default="glm", description="a chat model; None skips it")
    upscale_streams: int = Field(default=16, ge=1, description="the load step, in streams")
    upscale_repetitions: int = Field(default=2, ge=0)
    upscale_max_tokens: int = Field(default=32, ge=1)
    compare_without_warm_pool: bool = Field(
        default=True, description="also cycle each model in a copy of the app without the pool"
    )
    settle_at_zero_s: float = Field(
        default=2.0,
        ge=0,
        description="wait after reaching zero: a model idle for minutes has handles that know it "
        "has no replica, so the request's handle reports it to the controller at once",
    )
    warm_pool_fill_timeout_s: float = Field(
        default=60, gt=0, description="a cycle with the pool waits this long for a full pool"
    )
    controller_idle_cpu_s: float = Field(
        default=10.0, ge=0, description="time the controller's CPU at zero this long; 0 skips"
    )
    platform_idle_cpu_s: float = Field(
        default=20.0,
        ge=0,
        description="time every process of the cluster at zero traffic this long, the shipped "
        "application alone deployed; 0 skips",
    )
    platform_idle_settle_s: float = Field(
        default=10.0, ge=0, description="wait this long at zero before timing the idle cluster"
    )
    keep_warm: bool = Field(default=True, description="time a keep-warm window's wake-up")
    keep_warm_lead_s: float = Field(
        default=45, gt=0, description="the window opens this long after its deploy is sent"
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> Self:
        variant = ServeVariant(
            metrics_interval=args.coldstart_metrics_interval,
            runtime_env=args.coldstart_runtime_env,
            ray_env=dict(item.split("=", 1) for item in args.coldstart_ray_env or ()),
            control_loop_s=args.coldstart_control_loop_s,
        )
        fields |= {"http_port": args.coldstart_http_port, "variant": variant}
        if args.coldstart_cycles is not None:
            fields["cycles"] = args.coldstart_cycles
        if args.coldstart_models:
            fields["models"] = tuple(args.coldstart_models.split(","))
        if args.coldstart_without_pool_comparison:
            fields["compare_without_warm_pool"] = False
        if args.coldstart_import_repetitions is not None:
            fields["import_repetitions"] = args.coldstart_import_repetitions
        if args.coldstart_without_keep_warm:
            fields["keep_warm"] = False
        if args.coldstart_upscale_repetitions is not None:
            fields["upscale_repetitions"] = args.coldstart_upscale_repetitions
        return super().from_args(args, **fields)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("coldstart suite")
    group.add_argument("--coldstart-http-port", type=int, default=8124)
    group.add_argument("--coldstart-cycles", type=int, help="cold starts per model")
    group.add_argument("--coldstart-models", help="comma-separated, default: all four")
    group.add_argument(
        "--coldstart-metrics-interval",
        choices=("shipped", "default"),
        default="shipped",
        help="autoscaling metrics push interval: serve_config.yaml's metrics_interval_s "
        "(shipped) or Ray Serve's default of 10 s (default)",
    )
    group.add_argument(
        "--coldstart-runtime-env",
        choices=("app", "none"),
        default="app",
        help="keep serve_config.yaml's app runtime_env, with its RAY_SERVE_*_PUSH_INTERVAL_S "
        "variables (app), or deploy without one (none)",
    )
    group.add_argument(
        "--coldstart-control-loop-s",
        type=float,
        help="Serve's control loop interval for this run instead of serve_config.yaml's "
        "controller_options (Ray Serve's default: 0.1)",
    )
    group.add_argument(
        "--coldstart-ray-env",
        action="append",
        metavar="RAY_X=VALUE",
        help="raylet setting for this run, e.g. RAY_num_workers_soft_limit=16 (repeatable)",
    )
    group.add_argument("--coldstart-upscale-repetitions", type=int, help="0 skips it")
    group.add_argument("--coldstart-import-repetitions", type=int, help="0 skips it")
    group.add_argument(
        "--coldstart-without-keep-warm", action="store_true", help="skip the keep-warm window"
    )
    group.add_argument(
        "--coldstart-without-pool-comparison",
        action="store_true",
        help="skip the cycles in a copy of the application without the warm pool",
    )
