"""The router_cpu suite: CPU per request of the router, two ways.

- in process (no Ray): the router's app alone on fake model handles, per endpoint, plus the
  embeddings body's old and new encoders and the ledger's cost, on vs off
  (benchmarks.router_cpu.in_process);
- in its replicas: our application on a private Ray + Serve, the router replicas' and the
  front's own process counters around N requests per endpoint (benchmarks.router_cpu.replicas);
  `--router-cpu-in-process-only` skips it.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from pydantic import Field

from benchmarks.lib.config import ServedBenchConfig
from benchmarks.lib.edge_app import our_application
from benchmarks.lib.goals import GoalRecord, dig, goal
from benchmarks.lib.served import ray_workers, served
from benchmarks.router_cpu.in_process import measure_in_process
from benchmarks.router_cpu.replicas import measure_replicas

NEEDS_RAY = True  # the replicas' part; the in-process part runs anywhere

# Router-replica CPU per embedding request, at most. The app's own share (in process) must stay
# well under it, so it is held to the same bound.
EMBEDDING_CPU_TARGET_US = 1000.0
# The usage ledger may cost the router at most 5% more CPU per request.
LEDGER_CPU_RATIO_TARGET = 1.05


class RouterCpuBenchConfig(ServedBenchConfig):
    QUICK = {"in_process_requests": 100, "in_process_rounds": 3, "replica_requests": 100}

    in_process_requests: int = Field(default=400, ge=1, description="per round, per endpoint")
    in_process_rounds: int = Field(default=5, ge=1)
    replicas: bool = Field(default=True, description="also measure in the router replicas")
    replica_requests: int = Field(default=200, ge=1, description="per endpoint")
    replica_clients: int = Field(default=4, ge=1)
    replica_idle_s: float = Field(default=3.0, gt=0, description="idle CPU sampled before each")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("router_cpu suite")
    group.add_argument(
        "--router-cpu-requests",
        type=int,
        default=None,
        help="in-process requests per round (default 400, quick 100)",
    )
    group.add_argument(
        "--router-cpu-in-process-only",
        action="store_true",
        help="skip the router replicas' CPU (no cluster)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {"replicas": not args.router_cpu_in_process_only}
    if args.router_cpu_requests:
        fields["in_process_requests"] = args.router_cpu_requests
    return run_router_cpu_suite(RouterCpuBenchConfig.from_args(args, **fields))


def run_router_cpu_suite(config: RouterCpuBenchConfig) -> dict[str, Any]:
    result: dict[str, Any] = {
        "config": config.model_dump(mode="json"),
        "in_process": measure_in_process(
            config.in_process_requests, config.in_process_rounds, config.serve_config
        ),
    }
    if config.replicas:
        edge = our_application(config)
        with served(config, [edge]) as (base_url, _):
            result["processes"] = ray_workers()
            result["replicas"] = asyncio.run(
                measure_replicas(
                    base_url,
                    config.replica_requests,
                    config.replica_clients,
                    config.replica_idle_s,
                )
            )
    result["goals"] = goals(result, replicas_measured=config.replicas)
    return result


def goals(result: dict[str, Any], *, replicas_measured: bool) -> dict[str, GoalRecord]:
    verdicts = {
        "embedding_router_app_cpu_us": goal(
            dig(result, "in_process", "endpoints", "embeddings_float", "cpu_us_per_request"),
            EMBEDDING_CPU_TARGET_US,
            "µs",
            at_most=True,
            note="the router app alone, in process, 1 text, 384-d floats; the replica's process "
            "adds Ray Serve's per-request work (router_cpu_per_embedding_request)",
        )
    }
    verdicts["ledger_router_cpu_ratio"] = goal(
        dig(result, "in_process", "ledger", "embeddings_float", "on_over_off"),
        LEDGER_CPU_RATIO_TARGET,
        "x",
        at_most=True,
        note="router CPU per embedding request with the ledger on / off (SQLite), in process, "
        "rounds alternated in one run",
    )
    if replicas_measured:
        verdicts["router_cpu_per_embedding_request"] = goal(
            dig(result, "replicas", "embeddings", "router_cpu_us_per_request"),
            EMBEDDING_CPU_TARGET_US,
            "µs",
            at_most=True,
        )
    return verdicts
