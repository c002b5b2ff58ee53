"""The at-rest suite's settings and the command-line flags that set them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, Field, model_validator

from benchmarks.lib.config import BenchConfig
from deployments.config import PROJECT_ROOT


class ColdCycleSettings(BaseModel):
    """The cold cycles' settings (benchmarks.atrest.cold_cycles), shared by the suites that time
    a model's cold starts from zero: the at-rest suite's embedding model, the at-size GLM."""

    zero_margin_s: float = Field(
        default=120,
        gt=0,
        description="after the longest idle delay, how long the models may take to reach zero",
    )
    cold_cycles: int = Field(
        default=10,
        ge=1,
        description="the model's cold starts from zero timed this many times through the HTTP "
        "port (after one untimed request that sets the pace)",
    )
    cold_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="each cold cycle's request this long after the one before (sooner never: "
        "later only while the pools are not yet at zero)",
    )
    cold_idle_delay_s: float = Field(
        default=5.0,
        gt=0,
        description="the cold model's downscale delays in the served copy, whatever else it "
        "says: back to zero between cycles",
    )

    @model_validator(mode="after")
    def _pools_reach_zero_between_cycles(self) -> Self:
        if self.cold_idle_delay_s >= self.cold_interval_s:
            raise ValueError(
                f"cold_idle_delay_s ({self.cold_idle_delay_s:g}) must be under cold_interval_s "
                f"({self.cold_interval_s:g}): the pools reach zero between cycles"
            )
        return self


class AtRestBenchConfig(BenchConfig, ColdCycleSettings):
    QUICK = {"window_s": 10.0, "settle_s": 3.0, "idle_delay_s": 3.0, "cold_cycles": 2}

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

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> Self:
        if args.atrest_window_s is not None:
            fields["window_s"] = args.atrest_window_s
        if args.atrest_idle_delay_s is not None:
            fields["idle_delay_s"] = args.atrest_idle_delay_s
        if args.atrest_cold_cycles is not None:
            fields["cold_cycles"] = args.atrest_cold_cycles
        if args.atrest_cold_interval_s is not None:
            fields["cold_interval_s"] = args.atrest_cold_interval_s
        if args.atrest_cold_idle_delay_s is not None:
            fields["cold_idle_delay_s"] = args.atrest_cold_idle_delay_s
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
        "--atrest-cold-cycles",
        type=int,
        help="the embedding model's cold starts timed after the window (default 10; quick: 2)",
    )
    group.add_argument(
        "--atrest-cold-interval-s",
        type=float,
        help="seconds from one cold cycle's request to the next (default 10)",
    )
    group.add_argument(
        "--atrest-cold-idle-delay-s",
        type=float,
        help="the embedding pools' downscale delays in the copy (default 5)",
    )
    group.add_argument(
        "--atrest-serve-config", help="the serve config to run (default: serve_config.yaml)"
    )
