"""The front-door suite's settings and the command-line flags that set them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal, Self, get_args

from pydantic import Field, field_validator

from benchmarks.lib.config import BenchConfig
from deployments.config import PROJECT_ROOT

Target = Literal[
    "router-replica",
    "haproxy",
    "front-spare",
    "edge-control",
    "serve-controller",
    "model-replica",
    "serve-deploy",
]
# The front first, then what stands behind it; last an operator's `serve deploy` of a changed
# config (redeploy.py), which replaces the routers and edge-control one by one.
TARGETS: tuple[Target, ...] = get_args(Target)


class FrontDoorBenchConfig(BenchConfig):
    # Smoke size: two kills that heal in seconds (HAProxy's takes Serve's proxy health check).
    QUICK = {
        "targets": ("router-replica", "edge-control"),
        "warmup_s": 3.0,
        "after_kill_s": 8.0,
        "recover_timeout_s": 60.0,
    }

    serve_config: Path = PROJECT_ROOT / "serve_config.yaml"
    ray_num_cpus: int = Field(default=4, ge=1)
    targets: tuple[Target, ...] = Field(default=TARGETS, min_length=1)
    warmup_s: float = Field(default=5.0, ge=0, description="load before the first kill")
    after_kill_s: float = Field(default=20.0, gt=0, description="load after each kill, at least")
    recover_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="after after_kill_s, load goes on until the front door has settled (no "
        "failure for settled_s, the application RUNNING) or this long has passed",
    )
    settled_s: float = Field(default=3.0, gt=0)
    embedding_clients: int = Field(default=6, ge=0)
    chat_clients: int = Field(default=2, ge=0)
    chat_max_tokens: int = Field(default=16, ge=1)
    probe_interval_s: float = Field(
        default=0.05, gt=0, description="a new connection this often (refused ones are seen)"
    )
    admin_interval_s: float = Field(default=0.5, gt=0, description="an /admin request this often")
    error_backoff_s: float = Field(
        default=0.5,
        ge=0,
        description="a pooled client waits this long after a failed request before its next, "
        "as the OpenAI SDK's first retry does (not retried: the failure is counted)",
    )
    request_timeout_s: float = Field(default=30.0, gt=0)
    proxy_health_check_period_s: float | None = Field(
        default=None,
        gt=0,
        description="RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S in the copy's controller_options "
        "(Serve restarts a dead HAProxy after 3 failed checks); None: as shipped (1 s)",
    )
    start_timeout_s: float = Field(default=600, gt=0, description="until the application runs")

    @field_validator("targets")
    @classmethod
    def _each_target_once(cls, targets: tuple[Target, ...]) -> tuple[Target, ...]:
        if len(set(targets)) != len(targets):
            raise ValueError(f"each target once: {list(targets)}")
        return targets

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> Self:
        if args.front_door_targets is not None:
            fields["targets"] = tuple(t for t in args.front_door_targets.split(",") if t)
        if args.front_door_after_kill_s is not None:
            fields["after_kill_s"] = args.front_door_after_kill_s
        if args.proxy_health_check_period_s is not None:
            fields["proxy_health_check_period_s"] = args.proxy_health_check_period_s
        return super().from_args(args, **fields)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("front_door suite")
    group.add_argument(
        "--front-door-targets",
        help=f"comma-separated, killed in this order (default: {','.join(TARGETS)}; quick: "
        "router-replica,edge-control)",
    )
    group.add_argument(
        "--front-door-after-kill-s",
        type=float,
        help="seconds of load after each kill, at least (default 20; quick: 8)",
    )
    group.add_argument(
        "--proxy-health-check-period-s",
        type=float,
        help="Serve's proxy health check period in the copy of serve_config.yaml (default: as "
        "shipped, 1 s): how soon a dead HAProxy is restarted",
    )
