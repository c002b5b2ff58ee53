"""The peers suite: our app next to what a user would run instead, in one private Ray + Serve,
behind the same proxy, rounds interleaved so the shared machine's noise lands on both sides.

- embeddings: the docs-pattern PyTorch deployment (`@serve.batch(32, 5 ms)`), 1 and 32 clients;
- chat: `transformers` `generate()` per request on the same tiny GLM, 16 concurrent requests;
- TTFT of one stream vs one decode step + the router hop;
- router CPU per request, read from the router replicas' own processes.
Each ratio is reported next to its goal; a figure that cannot be computed is a miss that says so.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field
from ray import serve

from benchmarks.http_load import (
    Endpoint,
    async_client,
    closed_loop_throughput,
    latency_summary,
    timed_chat_stream,
    timed_post,
)
from benchmarks.models import CHAT_PROMPT, benchmark_sentences
from benchmarks.peers import cpu
from benchmarks.peers.decode_profile import decode_profile
from benchmarks.private_serve import apply_applications, private_serve
from benchmarks.router import BYPASS_CACHE, EDGE_APP, RouterBenchConfig, edge_application
from deployments.config import PROJECT_ROOT, parse_app_config

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Ingress = Literal["proxy", "direct", "haproxy"]

# Goals (issue 14), each a ratio of numbers measured side by side in this run.
EMBEDDING_32_TARGET = 1.5  # our requests/s over the docs pattern's at 32 clients, at least
EMBEDDING_1_TARGET = 1.0  # the same at 1 client
CHAT_PEER_TARGET = 4.0  # aggregate tokens/s at 16 streams, ours over generate() per request
CHAT_8_VS_1_TARGET = 4.0  # our runtime, 8 streams over 1
TTFT_TARGET = 1.2  # TTFT p50 over (decode step p50 + router hop p50), at most
ROUTER_CPU_EMBEDDING_TARGET_US = 1000.0  # router-replica CPU per embedding request, at most

# Ray Serve 2.60's ingress switches, read by the controller and proxies at start.
INGRESS_ENV: Mapping[Ingress, Mapping[str, str]] = {
    "proxy": {},
    "direct": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1"},
    "haproxy": {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"},
}

PEER_EMBEDDING = ("peer-embedding", "/peer/embeddings", "DocsPatternEmbedder")
PEER_CHAT = ("peer-chat", "/peer/chat", "DocsPatternChat")
ROUTER_TITLE = f"ray::ServeReplica:{EDGE_APP}:router"
PROXY_TITLE = "ray::ProxyActor"

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


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return run_peers_suite(PeersBenchConfig.from_args(args))


def run_peers_suite(config: PeersBenchConfig, clock: Clock = time.perf_counter) -> dict[str, Any]:
    shipped = yaml.safe_load(config.serve_config.read_text())
    base_url = f"http://127.0.0.1:{config.http_port}"
    edge = edge_application(shipped, RouterBenchConfig(models_dir=config.models_dir), 32)
    # The shipped embedding batch size, not the router suite's override.
    edge = _shipped_batching(edge, shipped)
    if config.router_replicas is not None:
        (router,) = [d for d in edge["deployments"] if d["name"] == "router"]
        router["num_replicas"] = config.router_replicas
    results: dict[str, Any] = {"config": config.model_dump(mode="json")}
    with (
        _ingress_env(config.ingress, config.http_port),
        private_serve(config.ray_num_cpus, config.http_port),
    ):
        apply_applications(
            [edge, *peer_applications(edge, config)], config.http_port, config.deploy_timeout_s
        )
        results["processes"] = _titles()
        results["embeddings"] = asyncio.run(bench_embeddings(config, base_url, clock))
        results["router_cpu"] = asyncio.run(bench_router_cpu(config, base_url))
        results["chat"] = asyncio.run(bench_chat(config, base_url, clock))
    glm = parse_app_config(edge["args"]).models["glm"]
    results["decode"] = decode_profile(
        config.models_dir / "glm", glm.intra_op_threads, config.decode_tokens
    )
    results["goals"] = goals(results)
    return results


# ---- setup -------------------------------------------------------------------------------------


@contextmanager
def _ingress_env(ingress: Ingress, http_port: int) -> Iterator[None]:
    """The switches must be in the environment Ray's processes inherit from this driver."""
    changes = dict(INGRESS_ENV[ingress])
    if ingress != "proxy":
        # Replicas that take HTTP themselves bind ports from a range (30000+ by default, which
        # another Serve on the machine may hold): ours sit just above our own HTTP port.
        changes |= {
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(http_port + 100),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(http_port + 199),
            "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(http_port + 200),
            "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(http_port + 299),
        }
    if ingress == "haproxy":
        # Per-run paths: Serve's defaults under /tmp/haproxy-serve would collide with any other
        # HAProxy-fronted Serve on the machine.
        state = f"/tmp/haproxy-serve-{os.getpid()}"
        changes |= {
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{state}/haproxy.cfg",
            "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{state}/admin.sock",
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": state,
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{state}/server-state",
        }
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _shipped_batching(edge: dict[str, Any], shipped: dict[str, Any]) -> dict[str, Any]:
    (app,) = [a for a in shipped["applications"] if a["name"] == EDGE_APP]
    user_configs = {d["name"]: d.get("user_config") for d in app["deployments"]}
    for deployment in edge["deployments"]:
        if deployment["name"] == "embedding":
            deployment["user_config"] = user_configs["embedding"]
    return edge


def peer_applications(edge: dict[str, Any], config: PeersBenchConfig) -> list[dict[str, Any]]:
    """The peers get what our model deployments get: CPU share, threads, max_ongoing_requests;
    only the serving code differs."""
    app_config = parse_app_config(edge["args"])
    options = {d["name"]: d for d in edge["deployments"]}
    module = "benchmarks.peers.apps"

    def peer(
        spec: tuple[str, str, str], builder: str, ours: str, model_dir: Path
    ) -> dict[str, Any]:
        name, route, deployment = spec
        model = app_config.models[ours]
        return {
            "name": name,
            "route_prefix": route,
            "import_path": f"{module}:{builder}",
            "args": {"model_dir": str(model_dir), "torch_threads": max(1, model.intra_op_threads)},
            "deployments": [
                {
                    "name": deployment,
                    "num_replicas": 1,
                    "max_ongoing_requests": options[ours]["max_ongoing_requests"],
                    "ray_actor_options": {"num_cpus": model.num_cpus},
                }
            ],
        }

    return [
        peer(
            PEER_EMBEDDING, "build_docs_embedding", "embedding", app_config.model_path("embedding")
        ),
        peer(PEER_CHAT, "build_docs_chat", "glm", app_config.model_path("glm")),
    ]


def _titles() -> dict[str, int]:
    """The Ray workers of this private cluster by title: which replicas the CPU figures read."""
    counts: dict[str, int] = {}
    for info in cpu.descendants(os.getpid(), cpu.processes()):
        if info.title.startswith("ray::"):
            title = info.title.split()[0]
            counts[title] = counts.get(title, 0) + 1
    return dict(sorted(counts.items()))


# ---- embeddings --------------------------------------------------------------------------------


async def bench_embeddings(config: PeersBenchConfig, base_url: str, clock: Clock) -> dict[str, Any]:
    sentences = benchmark_sentences(256)
    targets = {
        "ours": (Endpoint(f"{base_url}/v1/embeddings", BYPASS_CACHE), {"model": "embedding"}),
        "docs_pattern": (Endpoint(f"{base_url}{PEER_EMBEDDING[1]}"), {}),
    }
    result: dict[str, Any] = {"sentences": len(sentences)}
    async with async_client(max(config.embedding_clients)) as client:
        vectors = {}
        for name, (endpoint, extra) in targets.items():
            body = {**extra, "input": sentences[0]}
            response = await _ready(client, endpoint, body)
            vectors[name] = np.asarray(response["data"][0]["embedding"], dtype=np.float64)
        # Same weights, same sentence: the two answers must agree (else the race is unfair).
        result["cosine_ours_vs_docs_pattern"] = round(
            float(vectors["ours"] @ vectors["docs_pattern"])
            / float(np.linalg.norm(vectors["ours"]) * np.linalg.norm(vectors["docs_pattern"])),
            6,
        )
        for clients in config.embedding_clients:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
            for round_index in range(config.rounds):
                for name in _rotated(list(targets), round_index):
                    endpoint, extra = targets[name]

                    async def send(
                        n: int, endpoint: Endpoint = endpoint, extra: dict = extra
                    ) -> None:
                        body = {**extra, "input": sentences[n % len(sentences)]}
                        await timed_post(client, endpoint, body, clock)

                    runs[name].append(
                        await closed_loop_throughput(
                            send, clients, config.warmup_s, config.measure_s, clock
                        )
                    )
                    log.info("embeddings %s, %d clients: %s", name, clients, runs[name][-1])
            result[f"clients_{clients}"] = _compare_runs(runs)
    return result


def _compare_runs(runs: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name, samples in runs.items():
        rates = [s["requests_per_s"] for s in samples]
        p50s = [s["latency"]["p50_ms"] for s in samples if s["latency"]]
        summary[name] = {
            "requests_per_s": round(statistics.median(rates), 2),
            "p50_ms": round(statistics.median(p50s), 2) if p50s else None,
            "rounds": [
                {"requests_per_s": r, "p50_ms": p} for r, p in zip(rates, p50s, strict=False)
            ],
        }
    ours, peer = summary["ours"], summary["docs_pattern"]
    summary["throughput_ratio"] = _ratio(ours["requests_per_s"], peer["requests_per_s"])
    summary["p50_ratio"] = (
        _ratio(ours["p50_ms"], peer["p50_ms"]) if ours["p50_ms"] and peer["p50_ms"] else None
    )
    return summary


# ---- router CPU --------------------------------------------------------------------------------


async def bench_router_cpu(config: PeersBenchConfig, base_url: str) -> dict[str, Any]:
    """µs of CPU per request in the router replicas (and the proxy), per endpoint: the process
    counters before and after `cpu_requests` requests, from `cpu_clients` closed loops."""
    routers = cpu.worker_pids(ROUTER_TITLE)
    # The front: Serve's Python proxy, plus HAProxy when it fronts the replicas.
    proxies = cpu.worker_pids(PROXY_TITLE) + cpu.haproxy_pids()
    if not routers:
        return {"error": f"no {ROUTER_TITLE} process found below this driver"}
    sentences = benchmark_sentences(256)
    chat_body = {
        "model": "glm",
        "messages": list(CHAT_PROMPT),
        "max_tokens": 8,
        "temperature": 0.7,
    }
    endpoints: dict[str, tuple[str, Callable[[int], dict[str, Any]]]] = {
        "embeddings": (
            "/v1/embeddings",
            lambda n: {"model": "embedding", "input": sentences[n % len(sentences)]},
        ),
        "moderations": ("/v1/moderations", lambda n: {"input": sentences[n % len(sentences)]}),
        "chat_completions": ("/v1/chat/completions", lambda n: {**chat_body, "seed": n}),
    }
    result: dict[str, Any] = {"router_replicas": len(routers), "front_processes": len(proxies)}
    async with async_client(config.cpu_clients) as client:
        for name, (path, body) in endpoints.items():
            endpoint = Endpoint(f"{base_url}{path}", BYPASS_CACHE)
            requests = (
                config.cpu_requests if name != "chat_completions" else config.cpu_requests // 4
            )
            await timed_post(client, endpoint, body(0), time.perf_counter)  # warm
            # What the replicas burn with no request (metrics, long polls), subtracted below.
            idle_before = (cpu.cpu_seconds(routers), cpu.cpu_seconds(proxies))
            await asyncio.sleep(config.cpu_idle_s)
            idle_rate = (
                (cpu.cpu_seconds(routers) - idle_before[0]) / config.cpu_idle_s,
                (cpu.cpu_seconds(proxies) - idle_before[1]) / config.cpu_idle_s,
            )
            started = time.perf_counter()
            before = (cpu.cpu_seconds(routers), cpu.cpu_seconds(proxies))
            counter = iter(range(requests))

            async def loop(
                endpoint: Endpoint = endpoint,
                body: Callable = body,
                counter: Iterator[int] = counter,
            ) -> None:
                for n in counter:
                    await timed_post(client, endpoint, body(n), time.perf_counter)

            await asyncio.gather(*(loop() for _ in range(config.cpu_clients)))
            elapsed = time.perf_counter() - started
            router_s = cpu.cpu_seconds(routers) - before[0] - idle_rate[0] * elapsed
            proxy_s = cpu.cpu_seconds(proxies) - before[1] - idle_rate[1] * elapsed
            result[name] = {
                "requests": requests,
                "seconds": round(elapsed, 2),
                "router_cpu_us_per_request": round(max(router_s, 0.0) / requests * 1e6, 1),
                "front_cpu_us_per_request": round(max(proxy_s, 0.0) / requests * 1e6, 1),
                "idle_cpu_per_s": {
                    "router": round(idle_rate[0], 4),
                    "front": round(idle_rate[1], 4),
                },
            }
            log.info("router CPU %s: %s", name, result[name])
    return result


# ---- chat --------------------------------------------------------------------------------------


async def bench_chat(config: PeersBenchConfig, base_url: str, clock: Clock) -> dict[str, Any]:
    result: dict[str, Any] = {"max_tokens": config.chat_max_tokens, "streams": config.chat_streams}
    result["same_model"] = await _same_model_check(config)
    urls = {
        "ours": f"{base_url}/v1/chat/completions",
        "generate_per_request": f"{base_url}{PEER_CHAT[1]}",
    }

    def body(seed: int) -> dict[str, Any]:
        return {
            "model": "glm",
            "messages": list(CHAT_PROMPT),
            "max_tokens": config.chat_max_tokens,
            "temperature": 0.7,
            "seed": seed,
        }

    async with async_client(config.chat_streams) as client:
        for url in urls.values():
            await _ready(client, Endpoint(url, BYPASS_CACHE), body(0))

        async def burst(url: str, first_seed: int) -> tuple[float, int]:
            started = clock()
            answers = await asyncio.gather(
                *(_post_json(client, url, body(first_seed + i)) for i in range(config.chat_streams))
            )
            return clock() - started, sum(a["usage"]["completion_tokens"] for a in answers)

        rates: dict[str, list[float]] = {name: [] for name in urls}
        for round_index in range(config.rounds):
            for name in _rotated(list(urls), round_index):
                wall_s, tokens = await burst(urls[name], 100 * round_index)
                rates[name].append(round(tokens / wall_s, 2))
                log.info("chat %s: %d tokens in %.2fs", name, tokens, wall_s)
        result["aggregate_tokens_per_s"] = {
            name: {"median": round(statistics.median(r), 2), "rounds": r}
            for name, r in rates.items()
        }
        result["ratio_vs_generate_per_request"] = _ratio(
            result["aggregate_tokens_per_s"]["ours"]["median"],
            result["aggregate_tokens_per_s"]["generate_per_request"]["median"],
        )
        # TTFT of one stream vs what it cannot avoid: one decode step and the router hop. The hop
        # is a moderation request through the router (a tiny model behind the same handle path).
        ttfts = []
        for seed in range(config.ttft_runs):
            timing = await timed_chat_stream(client, urls["ours"], body(seed), clock)
            ttfts.append(timing.ttft_s)
        hop = Endpoint(f"{base_url}/v1/moderations", BYPASS_CACHE)
        hops = [
            await timed_post(client, hop, {"input": "hello there"}, clock)
            for _ in range(config.ttft_runs * 3)
        ]
    result["ttft"] = latency_summary(ttfts)
    result["router_hop"] = latency_summary(hops)
    return result


async def _same_model_check(config: PeersBenchConfig) -> dict[str, Any]:
    """Greedy tokens from the peer's PyTorch model and from our ONNX graph must match."""
    from deployments.runtime.llm import LLMRuntime

    runtime = LLMRuntime(config.models_dir / "glm")
    try:
        prompt = runtime.tokenizer.encode_chat(list(CHAT_PROMPT))
        ours = runtime.graph.greedy_cached(prompt, 8)
    finally:
        runtime.close()
    handle = serve.get_deployment_handle(PEER_CHAT[2], app_name=PEER_CHAT[0])
    theirs = await handle.greedy.remote(prompt, 8)
    return {"greedy_tokens_equal": ours == theirs, "ours": ours, "peer": theirs}


# ---- helpers -----------------------------------------------------------------------------------


async def _post_json(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    response = await client.post(url, json=body, headers=BYPASS_CACHE)
    if response.status_code != 200:
        raise RuntimeError(f"POST {url}: {response.status_code} {response.text[:300]}")
    return response.json()


async def _ready(
    client: httpx.AsyncClient, endpoint: Endpoint, body: dict[str, Any], timeout_s: float = 300
) -> dict[str, Any]:
    """The first 200 (a replica may still be starting: 404/503 until then)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = await client.post(endpoint.url, json=body, headers=dict(endpoint.headers))
            if response.status_code == 200:
                return response.json()
            if response.status_code not in (404, 503) or time.monotonic() > deadline:
                raise RuntimeError(
                    f"POST {endpoint.url}: {response.status_code} {response.text[:300]}"
                )
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.5)


def _rotated(names: Sequence[str], round_index: int) -> list[str]:
    shift = round_index % len(names)
    return [*names[shift:], *names[:shift]]


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def _goal(
    value: float | None, target: float, unit: str, *, at_most: bool = False, missing: str = ""
) -> dict[str, Any]:
    met = value is not None and (value <= target if at_most else value >= target)
    goal: dict[str, Any] = {
        "value": value,
        "target": target,
        "at_most": at_most,
        "met": met,
        "unit": unit,
    }
    if value is None:
        goal["missing"] = missing or "not measured: counts as a miss"
    return goal


def _get(tree: Mapping[str, Any], *path: str) -> Any:
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def goals(results: Mapping[str, Any]) -> dict[str, Any]:
    """Every goal of issue 14 this suite measures; None (not computed) is a miss, with why."""
    c32 = _get(results, "embeddings", "clients_32") or {}
    c1 = _get(results, "embeddings", "clients_1") or {}
    p50_32 = c32.get("p50_ratio")
    step = _get(results, "decode", "step_ms_p50_batch_1")
    hop = _get(results, "chat", "router_hop", "p50_ms")
    ttft = _get(results, "chat", "ttft", "p50_ms")
    ttft_ratio = _ratio(ttft, step + hop) if step is not None and hop is not None else None
    return {
        "embeddings_32_clients_throughput_vs_docs_pattern": _goal(
            c32.get("throughput_ratio"), EMBEDDING_32_TARGET, "x requests/s"
        ),
        "embeddings_32_clients_p50_vs_docs_pattern": _goal(
            p50_32, 1.0, "x p50 latency", at_most=True
        ),
        "embeddings_1_client_throughput_vs_docs_pattern": _goal(
            c1.get("throughput_ratio"), EMBEDDING_1_TARGET, "x requests/s"
        ),
        "chat_16_streams_vs_generate_per_request": _goal(
            _get(results, "chat", "ratio_vs_generate_per_request"), CHAT_PEER_TARGET, "x tokens/s"
        ),
        "chat_8_vs_1_streams_on_our_runtime": _goal(
            _get(results, "decode", "speedup_8_vs_1"), CHAT_8_VS_1_TARGET, "x tokens/s"
        ),
        "ttft_p50_vs_decode_step_plus_router_hop": _goal(
            ttft_ratio, TTFT_TARGET, "x", at_most=True
        ),
        "router_cpu_per_embedding_request": _goal(
            _get(results, "router_cpu", "embeddings", "router_cpu_us_per_request"),
            ROUTER_CPU_EMBEDDING_TARGET_US,
            "µs",
            at_most=True,
        ),
    }
