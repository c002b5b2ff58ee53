"""The gateway suite's settings and the command-line flags that set them."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Self

from pydantic import Field

from benchmarks.lib.config import BenchConfig
from deployments.config import PROJECT_ROOT


class GatewayBenchConfig(BenchConfig):
    QUICK = {
        "light_alone_streams": 5,
        "light_streams": 8,
        "retry_tries": 3,
        "ready_polls": 2,
        "overhead_requests": 50,
        "identical_bursts": 3,
    }

    serve_config: Path = PROJECT_ROOT / "serve_config.yaml"
    ray_num_cpus: int = Field(default=4, ge=1)
    start_timeout_s: float = Field(default=600, gt=0, description="until the application runs")
    # Single flight: bursts of identical cacheable chat requests sent at once.
    chat_model: str = "glm"
    identical_bursts: int = Field(default=5, ge=1, description="each a request of its own")
    identical_requests: int = Field(default=32, ge=2, description="in one burst")
    identical_max_tokens: int = Field(default=32, ge=1)
    metrics_settle_s: float = Field(
        default=15.0,
        ge=0,
        description="after a model's last request, until Ray's metrics endpoint shows it (Ray "
        "reports a worker's metrics every 10 s)",
    )
    # Fairness: key A floods the chat model, key B sends one short stream at a time.
    flood_streams: int = Field(default=48, ge=1)
    flood_max_tokens: int = Field(default=96, ge=1)
    flood_ramp_s: float = Field(default=2.0, ge=0, description="the flood alone, before B sends")
    light_max_tokens: int = Field(default=8, ge=1)
    light_alone_streams: int = Field(default=20, ge=2, description="B's streams with no flood")
    light_streams: int = Field(default=40, ge=2, description="B's streams during the flood")
    light_gap_s: float = Field(default=0.2, ge=0, description="between two of B's streams")
    # Retry-After: a model at zero, asked with rejectIfBusy.
    retry_model: str = "kimi"
    idle_delay_s: float = Field(
        default=2.0,
        gt=0,
        description="the retry model's downscale delays in the copy (the others as shipped)",
    )
    retry_tries: int = Field(default=20, ge=1, description="refusals retried at their estimate")
    ready_polls: int = Field(default=20, ge=1, description="refusals followed by a poller")
    poll_interval_s: float = Field(default=0.1, gt=0, description="the poller sends this often")
    zero_settle_s: float = Field(
        default=2.0, ge=0, description="once Serve shows no replica, until the routers know"
    )
    zero_timeout_s: float = Field(default=120, gt=0, description="after the idle delay")
    ready_timeout_s: float = Field(default=60, gt=0, description="the poller's longest wait")
    # Overhead: warm embedding requests one at a time.
    overhead_requests: int = Field(default=200, ge=1)
    overhead_warmup: int = Field(default=10, ge=0)

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> Self:
        if args.gateway_retry_tries is not None:
            fields["retry_tries"] = args.gateway_retry_tries
        if args.gateway_ready_polls is not None:
            fields["ready_polls"] = args.gateway_ready_polls
        if args.gateway_serve_config is not None:
            fields["serve_config"] = Path(args.gateway_serve_config).resolve()
        return super().from_args(args, **fields)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("gateway suite")
    group.add_argument(
        "--gateway-retry-tries",
        type=int,
        help="refusals of a model at zero retried at their Retry-After (default 20; quick: 3)",
    )
    group.add_argument(
        "--gateway-ready-polls",
        type=int,
        help="refusals followed by a poller finding when the model answers (default 20; quick: 2)",
    )
    group.add_argument(
        "--gateway-serve-config", help="the serve config to run (default: serve_config.yaml)"
    )
