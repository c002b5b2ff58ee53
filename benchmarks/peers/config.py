"""The peers suite's settings, declared once (pydantic), and its command-line options."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from deployments.config import CLUSTER_SERVE_ENV, PROJECT_ROOT

Ingress = Literal["proxy", "direct", "haproxy"]

# Ray Serve 2.60's ingress switches, read by the controller and proxies at start.
INGRESS_ENV: Mapping[Ingress, Mapping[str, str]] = {
    "proxy": {},
    "direct": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
    "haproxy": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"},
}

# Ray Serve's transport switches as shipped (deployments.config.CLUSTER_SERVE_ENV), or Serve's
# own defaults for comparison.
ServeSwitches = Literal["shipped", "serve-defaults"]
SERVE_SWITCHES_ENV: Mapping[ServeSwitches, Mapping[str, str]] = {
    "shipped": {},  # benchmarks.cluster starts every cluster with CLUSTER_SERVE_ENV
    "serve-defaults": {name: "0" for name in CLUSTER_SERVE_ENV},
}

QUICK_SIZES: Mapping[str, Any] = {
    "rounds": 1,
    "warmup_s": 0.5,
    "measure_s": 2.0,
    "chat_max_tokens": 16,
    "ttft_runs": 3,
    "cpu_requests": 100,
    "decode_tokens": 16,
}


class PeersBenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models_dir: Path
    serve_config: Path = PROJECT_ROOT / "serve_config.yaml"
    http_port: int = Field(default=8125, ge=1024, le=65535)
    ray_num_cpus: int = Field(default=4, ge=1)
    deploy_timeout_s: float = Field(default=600, gt=0)
    ingress: Ingress = "proxy"
    router_replicas: int | None = Field(default=None, ge=1, description="None: as shipped")
    serve_switches: ServeSwitches = "shipped"
    rounds: int = Field(default=4, ge=1, description="interleaved rounds per comparison")
    embedding_clients: tuple[int, ...] = (1, 32)
    warmup_s: float = Field(default=1.0, ge=0)
    measure_s: float = Field(default=5.0, gt=0)
    chat_streams: int = Field(default=16, ge=1)
    chat_max_tokens: int = Field(default=32, ge=1)
    ttft_runs: int = Field(default=7, ge=1)
    cpu_requests: int = Field(default=200, ge=1, description="per endpoint, for router CPU")
    cpu_clients: int = Field(default=4, ge=1)
    cpu_idle_s: float = Field(default=3.0, gt=0, description="idle CPU sampled before each")
    decode_tokens: int = Field(default=48, ge=2)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PeersBenchConfig:
        config = cls(
            models_dir=Path(args.models_dir).resolve(),
            http_port=args.peers_http_port,
            ingress=args.peers_ingress,
            router_replicas=args.peers_router_replicas,
            serve_switches=args.peers_serve_switches,
        )
        return config.model_copy(update=dict(QUICK_SIZES)) if args.quick else config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--peers-http-port", type=int, default=8125, help="peers suite: Serve port")
    parser.add_argument(
        "--peers-ingress",
        choices=sorted(INGRESS_ENV),
        default="proxy",
        help="peers suite: Serve's Python proxy, direct ingress, or direct ingress + HAProxy",
    )
    parser.add_argument(
        "--peers-router-replicas",
        type=int,
        default=None,
        help="peers suite: router replicas (default: serve_config.yaml's)",
    )
    parser.add_argument(
        "--peers-serve-switches",
        choices=sorted(SERVE_SWITCHES_ENV),
        default="shipped",
        help="peers suite: the shipped gRPC transport switches, or Ray Serve's defaults",
    )
