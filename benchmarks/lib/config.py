"""Settings every suite declares the same way (pydantic, unknown fields refused, frozen, smoke
sizes applied on `--quick`), the served suites' cluster settings and their command-line options."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from deployments.config import PROJECT_ROOT
from edgectl.local_cluster import free_port

Provider = Literal["cpu", "auto", "cuda"]
Ingress = Literal["proxy", "router", "direct", "haproxy"]

# Ray Serve 2.60's ingress switches, read by the controller and proxies at start; each names both,
# since it overrides the serve config's controller_options. `haproxy`: as shipped. `router`: the
# router replicas' own port (router.listener), Serve's Python proxy beside it.
_PYTHON_PROXY = {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "0", "RAY_SERVE_ENABLE_HA_PROXY": "0"}
INGRESS_ENV: Mapping[Ingress, Mapping[str, str]] = {
    "proxy": _PYTHON_PROXY,
    "router": _PYTHON_PROXY,
    "direct": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_ENABLE_HA_PROXY": "0"},
    "haproxy": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"},
}

# Ray Serve's switches as the serve config ships them (its controller_options, applied as `serve
# run` does), or Serve's own defaults (no controller_options) for comparison.
ServeSwitches = Literal["shipped", "serve-defaults"]
SERVE_SWITCHES: tuple[ServeSwitches, ...] = ("shipped", "serve-defaults")


class BenchConfig(BaseModel):
    """A suite's settings. `QUICK` holds the smoke sizes `--quick` applies; `from_args` reads
    the options every suite shares, a suite's own fields come as keywords (and win over the
    quick sizes: `--quick --coldstart-cycles 3` runs 3 cycles)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    QUICK: ClassVar[Mapping[str, Any]] = {}

    models_dir: Path

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> Self:
        # Absolute: replicas do not start in our directory.
        values: dict[str, Any] = {"models_dir": Path(args.models_dir).resolve()}
        if args.quick:
            values.update(cls.QUICK)
        return cls(**(values | fields))


class ServedBenchConfig(BenchConfig):
    """A suite that deploys serve_config.yaml's application on a private Ray + Serve."""

    serve_config: Path = PROJECT_ROOT / "serve_config.yaml"
    ray_num_cpus: int = Field(default=4, ge=1)
    deploy_timeout_s: float = Field(default=600, gt=0)
    ingress: Ingress = "haproxy"
    router_replicas: int | None = Field(default=None, ge=1, description="None: as shipped")
    serve_switches: ServeSwitches = "shipped"
    listener_port: int | None = Field(
        default=None, description="the router replicas' own port; a free one with ingress 'router'"
    )

    @model_validator(mode="before")
    @classmethod
    def _listener_port_for_router_ingress(cls, values: Any) -> Any:
        router = isinstance(values, dict) and values.get("ingress") == "router"
        if router and values.get("listener_port") is None:
            return {**values, "listener_port": free_port()}
        return values

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> Self:
        served = {
            "ingress": args.ingress,
            "router_replicas": args.router_replicas,
            "serve_switches": args.serve_switches,
        }
        return super().from_args(args, **(served | fields))

    def controller_options(self) -> dict[str, Any] | None:
        """What Serve's controller starts with: the serve config's controller_options, as `serve
        run`/`serve deploy` apply them, with the ingress under test's switches; none with
        `serve-defaults` (the ingress switches then come from the driver's environment)."""
        if self.serve_switches == "serve-defaults":
            return None
        shipped = yaml.safe_load(self.serve_config.read_text(encoding="utf-8"))
        options: dict[str, Any] = shipped.get("controller_options") or {}
        runtime_env = options.get("runtime_env") or {}
        env_vars = {**(runtime_env.get("env_vars") or {}), **INGRESS_ENV[self.ingress]}
        return {**options, "runtime_env": {**runtime_env, "env_vars": env_vars}}


class PeeredBenchConfig(ServedBenchConfig):
    """A served suite whose figure has a peer baseline: what a user would deploy instead, in the
    same cluster, measured in rounds alternating with ours."""

    peers: bool = Field(default=True, description="deploy and measure the peer baseline too")

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> Self:
        return super().from_args(args, **({"peers": not args.no_peers} | fields))


def add_served_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of every suite that runs our application on a cluster."""
    group = parser.add_argument_group("served suites (embeddings, chat, router, router_cpu)")
    group.add_argument(
        "--ingress",
        choices=sorted(INGRESS_ENV),
        default="haproxy",
        help="ours reached through HAProxy in front of the router replicas (direct ingress, as "
        "shipped), Serve's Python proxy, the router replicas' own port (router.listener, "
        "Serve's proxy beside it), or direct ingress alone; the peers through the same front",
    )
    group.add_argument(
        "--router-replicas",
        type=int,
        default=None,
        help="router replicas (default: serve_config.yaml's)",
    )
    group.add_argument(
        "--serve-switches",
        choices=SERVE_SWITCHES,
        default="shipped",
        help="serve_config.yaml's controller_options (gRPC, control loop), or Ray Serve's defaults",
    )
    group.add_argument(
        "--no-peers",
        action="store_true",
        help="measure ours only: skip the peer baselines (embeddings, chat)",
    )
