"""The router suite, on a private local Ray + Serve running serve_config.yaml: our router's latency
next to a pass-through and the model as its own ingress, embedding throughput with and without
batching (changed live through user_config), and chat time-to-first-token and tokens/s."""

from __future__ import annotations

import argparse
import asyncio
import copy
import logging
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from benchmarks.cluster import apply_applications, serve_cluster
from benchmarks.http_load import (
    BadResponseError,
    Endpoint,
    StreamTiming,
    async_client,
    closed_loop_throughput,
    concurrent_latencies,
    interleaved_latencies,
    latency_summary,
    timed_chat_stream,
    timed_post,
)
from benchmarks.models import CHAT_PROMPT, benchmark_sentences
from deployments.config import PROJECT_ROOT, parse_app_config, without_regions
from deployments.runtime.embedding import EmbeddingRuntime
from deployments.runtime.sampling import SamplingParams
from deployments.runtime.session import SessionConfig
from edgectl.local_cluster import wait_until

log = logging.getLogger(__name__)

Clock = Callable[[], float]

EDGE_APP = "edge"
MODERATION_BODY = {"input": "hello there"}
EMBEDDING_SENTENCES = 256  # real sentences of 20-150 characters, cycled through
NOT_READY_STATUSES = (404, 503)
READY_TIMEOUT_S = 60

# Goals, each a ratio of numbers measured in the same run.
ROUTER_OVERHEAD_TARGET = 1.2  # ours / pass-through p50 latency, at most
BATCHING_SPEEDUP_TARGET = 3.0  # embedding requests/s, batched vs max_batch_size 1, at least

# The router's response cache would answer repeated bodies without calling the model: every
# request says bypass, except those timing a cache hit on purpose.
BYPASS_CACHE = {"x-edge-cache": "bypass"}

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

QUICK_SIZES: Mapping[str, Any] = {
    "moderation_rounds": 60,
    "moderation_warmup": 10,
    "concurrent_requests_per_client": 6,
    "concurrent_passes": 2,
    "embedding_warmup_s": 0.5,
    "embedding_measure_s": 2.0,
    "embedding_model_texts": 64,
    "chat_single_runs": 1,
}


class RouterBenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models_dir: Path
    serve_config: Path = PROJECT_ROOT / "serve_config.yaml"
    http_port: int = Field(default=8123, ge=1024, le=65535)
    ray_num_cpus: int = Field(default=4, ge=1)
    deploy_timeout_s: float = Field(default=300, gt=0)
    moderation_rounds: int = Field(default=300, ge=1, description="sequential, per target")
    moderation_warmup: int = Field(default=30, ge=1, description="per target, not timed")
    concurrent_clients: int = Field(default=8, ge=1)
    concurrent_requests_per_client: int = Field(default=30, ge=0, description="0 skips it")
    concurrent_passes: int = Field(default=6, ge=1, description="rotations over the targets")
    embedding_clients: int = Field(default=32, ge=1)
    embedding_batch_sizes: tuple[int, int] = (32, 1)  # (batched, unbatched)
    embedding_warmup_s: float = Field(default=1.5, ge=0)
    embedding_measure_s: float = Field(default=6.0, gt=0)
    embedding_model_texts: int = Field(default=128, ge=1, description="model-only ceiling")
    chat_model: str = "glm"
    chat_max_tokens: int = Field(default=64, ge=1)
    chat_temperature: float = 0.7
    chat_streams: int = Field(default=8, ge=1)
    chat_single_runs: int = Field(default=3, ge=1)
    chat_first_seed: int = 1000

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RouterBenchConfig:
        # Absolute: replicas do not start in our directory.
        config = cls(models_dir=Path(args.models_dir).resolve(), http_port=args.router_http_port)
        return config.model_copy(update=dict(QUICK_SIZES)) if args.quick else config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--router-http-port",
        type=int,
        default=8123,
        help="router suite: HTTP port of its private Serve (not 8000, which `make serve` uses)",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
    return run_router_suite(RouterBenchConfig.from_args(args))


def run_router_suite(config: RouterBenchConfig, clock: Clock = time.perf_counter) -> dict[str, Any]:
    # One pool per model: the router's own cost, not the regions' routing (benchmarks/regions.py).
    shipped = without_regions(yaml.safe_load(config.serve_config.read_text()), home="eu")
    batched, unbatched = config.embedding_batch_sizes
    base_url = f"http://127.0.0.1:{config.http_port}"

    def deploy(applications: Sequence[dict[str, Any]]) -> None:
        apply_applications(applications, config.http_port, config.deploy_timeout_s)

    with serve_cluster(config.ray_num_cpus, config.http_port):
        edge = edge_application(shipped, config, embedding_batch_size=batched)
        # The edge app first: the pass-throughs look its moderation deployment up by name.
        deploy([edge])
        deploy([edge, *baseline_applications(edge)])
        overhead = asyncio.run(bench_router_overhead(config, base_url, clock))
        embedding: dict[str, Any] = {"batched": bench_embedding(config, base_url, batched, clock)}
        # Only user_config changes: Serve reconfigures the running replica, no restart.
        edge = edge_application(shipped, config, embedding_batch_size=unbatched)
        deploy([edge, *baseline_applications(edge)])
        embedding["unbatched"] = bench_embedding(config, base_url, unbatched, clock)
        chat = bench_chat(config, base_url, clock)
    embedding["model_only"] = bench_embedding_model(config, edge, batched)
    for path in ("http", "handle"):
        embedding[f"speedup_{path}"] = _ratio(
            embedding["batched"][path]["requests_per_s"],
            embedding["unbatched"][path]["requests_per_s"],
        )
    sequential = overhead["sequential"]
    return {
        "config": config.model_dump(mode="json"),
        "setup": _setup(edge),
        "router_overhead": overhead,
        "embedding_throughput": embedding,
        "chat": chat,
        "goals": {
            "router_vs_passthrough_p50": _goal(
                sequential["ratio_p50"][GOAL_BASELINE], ROUTER_OVERHEAD_TARGET, "x", at_most=True
            ),
            "embedding_batching_speedup": _goal(
                embedding["speedup_http"], BATCHING_SPEEDUP_TARGET, "x requests/s"
            ),
        },
    }


def edge_application(
    shipped: dict[str, Any], config: RouterBenchConfig, embedding_batch_size: int
) -> dict[str, Any]:
    """serve_config.yaml's application as shipped, except: CPU, our models directory, no
    simulated RTT, one fixed replica per model (an autoscaler adding one mid-run would change
    what is measured) and the embedding batch size under test. The router keeps its shipped
    replica count; the pass-throughs copy it."""
    (app,) = [copy.deepcopy(a) for a in shipped["applications"] if a["name"] == EDGE_APP]
    args = app["args"]
    args["accelerator"] = "cpu"
    args["models_dir"] = str(config.models_dir)
    # The router sleeps each request's simulated RTT on purpose; that is the network being
    # acted out, not router overhead, so it is off here.
    args.setdefault("edge", {}).setdefault("latency", {})["real_delay_scale"] = 0
    for deployment in app.get("deployments", []):
        if deployment.pop("autoscaling_config", None) is not None:
            deployment["num_replicas"] = 1
        if deployment["name"] == "embedding":
            user_config = deployment.get("user_config") or {}
            deployment["user_config"] = {**user_config, "max_batch_size": embedding_batch_size}
    return app


def baseline_applications(edge: dict[str, Any]) -> list[dict[str, Any]]:
    """The comparison ingresses, each with the Serve options of what it stands in for: the
    pass-throughs take the router's, the model ingress the moderation deployment's."""
    options = {d["name"]: {k: v for k, v in d.items() if k != "name"} for d in edge["deployments"]}
    app_config = parse_app_config(edge["args"])
    moderation = app_config.models["moderation"]
    target = {"app_name": EDGE_APP, "deployment": "moderation"}
    module = "benchmarks.router_targets"
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


def _setup(edge: dict[str, Any]) -> dict[str, Any]:
    """What differs from serve_config.yaml as shipped, so the numbers are read right."""
    replicas = {d["name"]: d.get("num_replicas") for d in edge["deployments"]}
    return {
        "replicas": replicas,
        "simulated_rtt": "off (edge.latency.real_delay_scale = 0)",
        "response_cache": f"bypassed with {BYPASS_CACHE} except the router_cache_hit target",
        "baselines": "pass-throughs copy the router's Serve options; model_ingress the "
        "moderation deployment's",
    }


# ---- 1. router overhead ------------------------------------------------------------------------


async def bench_router_overhead(
    config: RouterBenchConfig, base_url: str, clock: Clock
) -> dict[str, Any]:
    endpoints = {
        name: Endpoint(f"{base_url}{prefix}/v1/moderations", headers)
        for name, (prefix, headers) in TARGETS.items()
    }
    async with async_client(config.concurrent_clients) as client:
        for endpoint in endpoints.values():
            await _first_success(client, endpoint, MODERATION_BODY, clock)
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
        result: dict[str, Any] = {"sequential": _compare(latencies)}
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
    result = _compare(latencies)
    result["requests_per_s"] = {
        name: round(len(latencies[name]) / walls[name], 2) for name in names
    }
    return result


def _compare(latencies: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    summaries = {name: latency_summary(samples) for name, samples in sorted(latencies.items())}
    ours = summaries[OURS]
    others = [name for name in summaries if name != OURS]
    return {
        "latency": summaries,
        "ratio_p50": {n: _ratio(ours["p50_ms"], summaries[n]["p50_ms"]) for n in others},
        "ratio_p99": {n: _ratio(ours["p99_ms"], summaries[n]["p99_ms"]) for n in others},
        "router_added_p50_ms": {
            n: round(ours["p50_ms"] - summaries[n]["p50_ms"], 3) for n in others
        },
    }


async def _first_success(
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    body: dict[str, Any],
    clock: Clock,
) -> None:
    """The proxy learns new routes a moment after an application runs: retry while it answers
    404 (no route yet) or 503 (no replica yet); any other failure is a bug to report at once."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            await timed_post(client, endpoint, body, clock)
            return
        except BadResponseError as error:
            if error.status_code not in NOT_READY_STATUSES or time.monotonic() > deadline:
                raise
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


# ---- 2. embedding batching ---------------------------------------------------------------------


def bench_embedding(
    config: RouterBenchConfig, base_url: str, max_batch_size: int, clock: Clock
) -> dict[str, Any]:
    """Closed-loop single-text requests, once the replica itself reports `max_batch_size`:
    through HTTP (proxy, router, replica: the goal), then straight to the deployment handle
    (the replica alone, fed from this process), to show which side limits the speedup."""
    handle = serve.get_deployment_handle("embedding", app_name=EDGE_APP)

    def replica_batching() -> dict[str, Any] | None:
        batching = handle.describe.remote().result()["batching"]
        return batching if batching["max_batch_size"] == max_batch_size else None

    # A redeploy returns before the controller has pushed the new user_config to the replica.
    batching = wait_until(
        replica_batching, config.deploy_timeout_s, f"embedding max_batch_size {max_batch_size}"
    )
    log.info(
        "embeddings: %d clients, max_batch_size %d, %.1fs via HTTP then via the handle",
        config.embedding_clients,
        max_batch_size,
        config.embedding_measure_s,
    )
    return {
        "batching": batching,
        "http": asyncio.run(_embedding_http_load(config, base_url, clock)),
        "handle": asyncio.run(_embedding_handle_load(config, handle, clock)),
    }


def bench_embedding_model(
    config: RouterBenchConfig, edge: dict[str, Any], batch_size: int
) -> dict[str, Any]:
    """The ceiling: the replica's own runtime in this process (same model, threads, sentences)
    at batch 1 and `batch_size`, with no Ray and no HTTP. Batching cannot buy more than this."""
    app_config = parse_app_config(edge["args"])
    session = SessionConfig(
        provider="cpu", intra_op_threads=app_config.models["embedding"].intra_op_threads
    )
    runtime = EmbeddingRuntime(app_config.model_path("embedding"), session)
    sentences = benchmark_sentences(EMBEDDING_SENTENCES)[: config.embedding_model_texts]
    runtime.embed(sentences[:batch_size])  # untimed: first-run allocations
    texts_per_s = {}
    for size in (1, batch_size):
        started = time.perf_counter()
        for start in range(0, len(sentences), size):
            runtime.embed(sentences[start : start + size])
        texts_per_s[size] = len(sentences) / (time.perf_counter() - started)
    return {
        "intra_op_threads": session.intra_op_threads,
        "texts": len(sentences),
        "texts_per_s": {str(size): round(rate, 1) for size, rate in texts_per_s.items()},
        "speedup": _ratio(texts_per_s[batch_size], texts_per_s[1]),
    }


async def _embedding_http_load(
    config: RouterBenchConfig, base_url: str, clock: Clock
) -> dict[str, Any]:
    sentences = benchmark_sentences(EMBEDDING_SENTENCES)
    endpoint = Endpoint(f"{base_url}/v1/embeddings", BYPASS_CACHE)
    async with async_client(config.embedding_clients) as client:

        async def send(n: int) -> None:
            body = {"model": "embedding", "input": sentences[n % len(sentences)]}
            await timed_post(client, endpoint, body, clock)

        await _first_success(client, endpoint, {"model": "embedding", "input": "hi"}, clock)
        return await closed_loop_throughput(
            send,
            config.embedding_clients,
            config.embedding_warmup_s,
            config.embedding_measure_s,
            clock,
        )


async def _embedding_handle_load(
    config: RouterBenchConfig, handle: DeploymentHandle, clock: Clock
) -> dict[str, Any]:
    sentences = benchmark_sentences(EMBEDDING_SENTENCES)

    async def send(n: int) -> None:
        await handle.embed.remote([sentences[n % len(sentences)]])

    return await closed_loop_throughput(
        send, config.embedding_clients, config.embedding_warmup_s, config.embedding_measure_s, clock
    )


# ---- 3. chat streaming -------------------------------------------------------------------------


def bench_chat(config: RouterBenchConfig, base_url: str, clock: Clock) -> dict[str, Any]:
    """Streams through HTTP (router: moderation gate, SSE) and straight from the chat
    deployment's handle (the engine alone), one at a time and `chat_streams` at once."""
    url = f"{base_url}/v1/chat/completions"
    handle = serve.get_deployment_handle(config.chat_model, app_name=EDGE_APP)

    def body(seed: int) -> dict[str, Any]:
        return {
            "model": config.chat_model,
            "messages": list(CHAT_PROMPT),
            "max_tokens": config.chat_max_tokens,
            "temperature": config.chat_temperature,
            "seed": config.chat_first_seed + seed,
        }

    async def over_http() -> dict[str, Any]:
        async with async_client(config.chat_streams) as client:
            return await _chat_runs(
                config, lambda seed: timed_chat_stream(client, url, body(seed), clock), clock
            )

    async def over_handle() -> dict[str, Any]:
        def stream(seed: int) -> Awaitable[StreamTiming]:
            params = SamplingParams(
                max_tokens=config.chat_max_tokens,
                temperature=config.chat_temperature,
                seed=config.chat_first_seed + seed,
            )
            return _timed_handle_stream(handle, list(CHAT_PROMPT), params, clock)

        return await _chat_runs(config, stream, clock)

    log.info(
        "chat: %d single streams, then %d at once, via HTTP then via the handle",
        config.chat_single_runs,
        config.chat_streams,
    )
    return {
        "model": config.chat_model,
        "max_tokens": config.chat_max_tokens,
        "http": asyncio.run(over_http()),
        "handle": asyncio.run(over_handle()),
    }


async def _chat_runs(
    config: RouterBenchConfig, stream: Callable[[int], Awaitable[StreamTiming]], clock: Clock
) -> dict[str, Any]:
    await stream(-1)  # warm-up, untimed
    single = [await stream(seed) for seed in range(config.chat_single_runs)]
    started = clock()
    concurrent = await asyncio.gather(*(stream(seed) for seed in range(config.chat_streams)))
    wall_s = clock() - started
    single_summary = _streams_summary(single, sum(t.total_s for t in single))
    concurrent_summary = _streams_summary(concurrent, wall_s)
    return {
        "single_stream": single_summary,
        f"{config.chat_streams}_concurrent_streams": concurrent_summary,
        "aggregate_speedup": _ratio(
            concurrent_summary["aggregate_tokens_per_s"], single_summary["aggregate_tokens_per_s"]
        ),
    }


async def _timed_handle_stream(
    handle: DeploymentHandle,
    messages: list[dict[str, Any]],
    params: SamplingParams,
    clock: Clock,
) -> StreamTiming:
    started = clock()
    first_text_at: float | None = None
    completion_tokens = 0
    stream = handle.options(stream=True).stream.remote(messages, params)
    assert isinstance(stream, DeploymentResponseGenerator)  # stream=True: Ray types a union
    async for reply in stream:
        chunk = reply.value
        if first_text_at is None and chunk.text:
            first_text_at = clock()
        completion_tokens = chunk.completion_tokens
    if first_text_at is None:
        raise RuntimeError(f"{handle.deployment_name} streamed no text")
    return StreamTiming(first_text_at - started, clock() - started, completion_tokens)


def _streams_summary(timings: Sequence[StreamTiming], wall_s: float) -> dict[str, Any]:
    """TTFT over the streams, each stream's own tokens/s, and all tokens over the wall time."""
    tokens = [t.completion_tokens for t in timings]
    return {
        "streams": len(timings),
        "ttft": latency_summary([t.ttft_s for t in timings]),
        "tokens_per_s_per_stream_median": round(
            statistics.median(t.tokens_per_s for t in timings), 2
        ),
        "aggregate_tokens_per_s": round(sum(tokens) / wall_s, 2),
        "completion_tokens": tokens,
    }


# ---- verdicts ----------------------------------------------------------------------------------


def _ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


def _goal(value: float | None, target: float, unit: str, at_most: bool = False) -> dict[str, Any]:
    """One goal's verdict; a value that was not measured (None) is not met."""
    met = value is not None and (value <= target if at_most else value >= target)
    return {"value": value, "target": target, "at_most": at_most, "met": met, "unit": unit}
