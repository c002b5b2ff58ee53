"""The at-rest suite's settings and the command-line flags that set them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Self

from pydantic import Field

from benchmarks.lib.config import BenchConfig
from deployments.config import PROJECT_ROOT


class AtRestBenchConfig(BenchConfig):
    QUICK = {"window_s": 10.0, "settle_s": 3.0, "idle_delay_s": 3.0}

    serve_config: Path = PROJECT_ROOT / "serve_config.yaml"
    ray_num_cpus: int = Field(default=4, ge=1)
    window_s: float = Field(
        default=40.0, gt=0, description="each side's processes timed at rest this long"
    )
    settle_s: float = Field(
        default=20.0,
        ge=0,
        description="wait this long once every model is at zero (its replicas stopping, the "
        "hello world's first seconds) before the window",
    )
    idle_delay_s: float | None = Field(
        default=None,
        gt=0,
        description="None: each model's downscale delays as shipped (minutes); a value: every "
        "model's downscale_delay_s and downscale_to_zero_delay_s set to it in the copy",
    )
    start_timeout_s: float = Field(default=600, gt=0, description="until an application runs")
    zero_margin_s: float = Field(
        default=120,
        gt=0,
        description="after the longest idle delay, how long the models may take to reach zero",
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> Self:
        if args.atrest_window_s is not None:
            fields["window_s"] = args.atrest_window_s
        if args.atrest_idle_delay_s is not None:
            fields["idle_delay_s"] = args.atrest_idle_delay_s
        if args.atrest_serve_config is not None:
            fields["serve_config"] = Path(args.atrest_serve_config).resolve()
        return super().from_args(args, **fields)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("atrest suite")
    group.add_argument(
        "--atrest-window-s", type=float, help="seconds each side is timed at rest (default 40)"
    )
    group.add_argument(
        "--atrest-idle-delay-s",
        type=float,
        help="every model's downscale delays in the copy (default: as shipped; quick: 3)",
    )
    group.add_argument(
        "--atrest-serve-config", help="the serve config to run (default: serve_config.yaml)"
    )
