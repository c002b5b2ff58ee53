"""The router suite, on a private Ray + Serve running serve_config.yaml's application: our router's
latency next to a pass-through with the same two hops and no logic (FastAPI and plain `__call__`,
benchmarks.router.passthroughs), the moderation model as its own ingress, and a cache hit; one
request at a time (interleaved), then concurrent clients. Then the response cache across the
router replicas: how many repeats of a request are HITs, whichever replica takes them."""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx
from pydantic import Field

from benchmarks.lib.config import ServedBenchConfig
from benchmarks.lib.edge_app import BYPASS_CACHE, EDGE_APP, deployment_options, our_application
from benchmarks.lib.goals import goal, ratio
from benchmarks.lib.http_load import (
    BadResponseError,
    Endpoint,
    async_client,
    concurrent_latencies,
    interleaved_latencies,
    ready,
    timed_post,
)
from benchmarks.lib.served import served
from deployments.config import parse_app_config
from edgectl.loadtest.summary import latency_stats_s

log = logging.getLogger(__name__)

NEEDS_RAY = True

Clock = Callable[[], float]

MODERATION_BODY = {"input": "hello there"}

# ours / pass-through p50 latency, at most (both measured in the same run).
ROUTER_OVERHEAD_TARGET = 1.2
# Repeats of a cached request answered from the cache, whichever router replica takes them.
REPEAT_HIT_RATE_TARGET = 1.0

# The ingresses a moderation request is timed through: (route prefix, headers). All but the model
# ingress reach the same moderation deployment of the edge application.
OURS = "router"
GOAL_BASELINE = "fastapi_passthrough"
TARGETS: Mapping[str, tuple[str, Mapping[str, str]]] = {
    OURS: ("", BYPASS_CACHE),
    "router_cache_hit": ("", {}),
    GOAL_BASELINE: ("/fastapi-passthrough", BYPASS_CACHE),
    "plain_passthrough": ("/plain-passthrough", BYPASS_CACHE),
    "model_ingress": ("/model-ingress", BYPASS_CACHE),
}


class RouterBenchConfig(ServedBenchConfig):
    QUICK = {
        "moderation_rounds": 60,
        "moderation_warmup": 10,
        "concurrent_requests_per_client": 6,
        "concurrent_passes": 2,
        "repeat_bodies": 5,
    }

    moderation_rounds: int = Field(default=300, ge=1, description="sequential, per target")
    moderation_warmup: int = Field(default=30, ge=1, description="per target, not timed")
    concurrent_clients: int = Field(default=8, ge=1)
    concurrent_requests_per_client: int = Field(default=30, ge=0, description="0 skips it")
    concurrent_passes: int = Field(default=6, ge=1, description="rotations over the targets")
    repeat_bodies: int = Field(default=30, ge=1, description="distinct requests, each repeated")
    repeats: int = Field(default=6, ge=2, description="times each is sent, the first included")


def run(args: argparse.Namespace) -> dict[str, Any]:
    return run_router_suite(RouterBenchConfig.from_args(args))


def run_router_suite(config: RouterBenchConfig, clock: Clock = time.perf_counter) -> dict[str, Any]:
    edge = our_application(config)
    # The edge app first: the pass-throughs look its moderation deployment up by name.
    with served(config, [edge, *baseline_applications(edge)]) as (base_url, _):
        overhead = asyncio.run(bench_router_overhead(config, base_url, clock))
        repeats = asyncio.run(bench_repeat_hit_rate(config, base_url))
    setup = _setup(edge)
    return {
        "config": config.model_dump(mode="json"),
        "setup": setup,
        "router_overhead": overhead,
        "repeat_hit_rate": repeats,
        "goals": {
            "router_vs_passthrough_p50": goal(
                overhead["sequential"]["ratio_p50"][GOAL_BASELINE],
                ROUTER_OVERHEAD_TARGET,
                "x",
                at_most=True,
            ),
            "repeat_hit_rate": goal(
                repeats["hit_rate_after_first"],
                REPEAT_HIT_RATE_TARGET,
                "share of repeats",
                note=f"{setup['replicas']['router']} router replicas, response cache "
                f"{setup['response_cache_backend']}",
            ),
        },
    }


def baseline_applications(edge: dict[str, Any]) -> list[dict[str, Any]]:
    """The comparison ingresses, each with the Serve options of what it stands in for: the
    pass-throughs take the router's, the model ingress the moderation deployment's."""
    options = deployment_options(edge)
    app_config = parse_app_config(edge["args"])
    moderation = app_config.models["moderation"]
    target = {"app_name": EDGE_APP, "deployment": "moderation"}
    module = "benchmarks.router.passthroughs"
    return [
        {
            "name": "fastapi-passthrough",
            "route_prefix": TARGETS[GOAL_BASELINE][0],
            "import_path": f"{module}:build_fastapi_passthrough",
            "args": target,
            "deployments": [{"name": "FastAPIPassThrough", **options["router"]}],
        },
        {
            "name": "plain-passthrough",
            "route_prefix": TARGETS["plain_passthrough"][0],
            "import_path": f"{module}:build_plain_passthrough",
            "args": target,
            "deployments": [{"name": "PlainPassThrough", **options["router"]}],
        },
        {
            "name": "model-ingress",
            "route_prefix": TARGETS["model_ingress"][0],
            "import_path": f"{module}:build_moderation_ingress",
            "args": {
                "name": "moderation",
                "model_dir": str(app_config.model_path("moderation")),
                "intra_op_threads": moderation.intra_op_threads,
                "num_cpus": moderation.num_cpus,
            },
            "deployments": [{"name": "moderation", **options["moderation"]}],
        },
    ]


async def bench_repeat_hit_rate(config: RouterBenchConfig, base_url: str) -> dict[str, Any]:
    """Each of `repeat_bodies` distinct moderation requests sent `repeats` times, one at a time:
    the first must be a MISS and every repeat a HIT, however Serve spreads them over the router
    replicas. Bodies new to this run, so an earlier run's entries play no part."""
    endpoint = Endpoint(f"{base_url}/v1/moderations")
    run_id = uuid.uuid4().hex[:12]
    seen: dict[str, int] = {}
    first: dict[str, int] = {}
    async with async_client(1) as client:
        await ready(client, endpoint, {"input": f"warm-up {run_id}"})
        for body_index in range(config.repeat_bodies):
            body = {"input": f"repeat {run_id} {body_index}"}
            for repeat in range(config.repeats):
                response = await client.post(endpoint.url, json=body)
                if response.status_code != 200:
                    raise BadResponseError(
                        f"POST {endpoint.url}: {response.status_code} {response.text[:300]}",
                        response.status_code,
                    )
                said = response.headers.get("x-edge-cache", "none")
                tally = first if repeat == 0 else seen
                tally[said] = tally.get(said, 0) + 1
    repeats = config.repeat_bodies * (config.repeats - 1)
    return {
        "first_requests": first,
        "repeats": seen,
        "hit_rate_after_first": ratio(seen.get("HIT", 0), repeats),
    }


def _setup(edge: dict[str, Any]) -> dict[str, Any]:
    """What differs from serve_config.yaml as shipped, so the numbers are read right."""
    replicas = {d["name"]: d.get("num_replicas") for d in edge["deployments"]}
    return {
        "replicas": replicas,
        "simulated_rtt": "off (edge.latency.real_delay_scale = 0)",
        "response_cache": f"bypassed with {dict(BYPASS_CACHE)} except the router_cache_hit target "
        "and repeat_hit_rate",
        "response_cache_backend": parse_app_config(edge["args"]).router.cache.backend,
        "baselines": "pass-throughs copy the router's Serve options; model_ingress the "
        "moderation deployment's",
    }


async def bench_router_overhead(
    config: RouterBenchConfig, base_url: str, clock: Clock
) -> dict[str, Any]:
    endpoints = {
        name: Endpoint(f"{base_url}{prefix}/v1/moderations", headers)
        for name, (prefix, headers) in TARGETS.items()
    }
    async with async_client(config.concurrent_clients) as client:
        for endpoint in endpoints.values():
            await ready(client, endpoint, MODERATION_BODY)
            for _ in range(config.moderation_warmup):
                await timed_post(client, endpoint, MODERATION_BODY, clock)
        log.info(
            "moderation: %d sequential rounds over %d targets",
            config.moderation_rounds,
            len(endpoints),
        )
        latencies = await interleaved_latencies(
            client, endpoints, MODERATION_BODY, config.moderation_rounds, clock
        )
        result: dict[str, Any] = {"sequential": compare(latencies)}
        if config.concurrent_requests_per_client:
            result[f"concurrency_{config.concurrent_clients}"] = await _concurrent_overhead(
                config, client, endpoints, clock
            )
    return result


async def _concurrent_overhead(
    config: RouterBenchConfig,
    client: httpx.AsyncClient,
    endpoints: Mapping[str, Endpoint],
    clock: Clock,
) -> dict[str, Any]:
    log.info("moderation: %d concurrent clients per ingress", config.concurrent_clients)
    latencies: dict[str, list[float]] = {name: [] for name in endpoints}
    walls: dict[str, float] = dict.fromkeys(endpoints, 0.0)
    names = sorted(endpoints)
    # Short passes in rotated order, so load from elsewhere on the machine is shared out.
    per_pass = max(1, config.concurrent_requests_per_client // config.concurrent_passes)
    for pass_index in range(config.concurrent_passes):
        shift = pass_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples, wall_s = await concurrent_latencies(
                client,
                endpoints[name],
                MODERATION_BODY,
                config.concurrent_clients,
                per_pass,
                clock,
            )
            latencies[name] += samples
            walls[name] += wall_s
    result = compare(latencies)
    result["requests_per_s"] = {
        name: round(len(latencies[name]) / walls[name], 2) for name in names
    }
    return result


def compare(latencies: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Each target's latency (ms) and ours against every other: p50 and p99 ratios, and the
    milliseconds the router adds at p50."""
    summaries = {name: latency_stats_s(samples) for name, samples in sorted(latencies.items())}
    ours = summaries[OURS]
    others = [name for name in summaries if name != OURS]
    return {
        "latency_ms": summaries,
        "ratio_p50": {n: ratio(ours["p50"], summaries[n]["p50"]) for n in others},
        "ratio_p99": {n: ratio(ours["p99"], summaries[n]["p99"]) for n in others},
        "router_added_p50_ms": {n: round(ours["p50"] - summaries[n]["p50"], 3) for n in others},
    }
