"""The embeddings suite, on a private Ray + Serve running serve_config.yaml's application (shipped
batching): single-text requests from closed-loop clients (1 and 32), ours and, with the peer (on
unless `--no-peers`), the docs-pattern PyTorch deployment (benchmarks.embeddings.peer) in
alternating rounds; then the same 32 clients with batching off (max_batch_size 1, changed live
through user_config) for the batching speed-up, each also straight to the deployment handle, and
the replica's runtime in this process at batch 1 and 32 (the ceiling batching can reach)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from pydantic import Field
from ray import serve
from ray.serve.handle import DeploymentHandle

from benchmarks.embeddings.peer import PEER_ROUTE, peer_application
from benchmarks.lib.cluster import apply_applications
from benchmarks.lib.config import PeeredBenchConfig
from benchmarks.lib.corpus import benchmark_sentences
from benchmarks.lib.edge_app import BYPASS_CACHE, EDGE_APP, our_application, our_url
from benchmarks.lib.goals import GoalRecord, dig, goal, ratio
from benchmarks.lib.http_load import (
    Endpoint,
    async_client,
    closed_loop_throughput,
    ready,
    rotated,
    timed_post,
)
from benchmarks.lib.served import served
from deployments.config import parse_app_config
from deployments.contracts.embedding_deployment import EmbeddingClient, EmbedRequest
from deployments.replica.engine.embedding import EmbeddingRuntime
from deployments.replica.engine.session import SessionConfig
from edgectl.local_cluster import wait_until

log = logging.getLogger(__name__)

NEEDS_RAY = True

Clock = Callable[[], float]

SENTENCES = 256  # real sentences of 20-150 characters, cycled through
OURS, PEER = "ours", "docs_pattern"
UNBATCHED = 1  # max_batch_size with batching off

# Goals, each a ratio of numbers measured in the same run.
BATCHING_SPEEDUP_TARGET = 3.0  # requests/s at the most clients, batched vs max_batch_size 1
PEER_THROUGHPUT_TARGETS: Mapping[int, float] = {32: 1.5, 1: 1.0}  # ours / docs pattern, at least
PEER_P50_TARGET = 1.0  # ours / docs pattern p50 latency at 32 clients, at most


class EmbeddingsBenchConfig(PeeredBenchConfig):
    QUICK = {"rounds": 1, "warmup_s": 0.5, "measure_s": 2.0, "model_texts": 64}

    rounds: int = Field(default=4, ge=1, description="interleaved rounds per comparison")
    clients: tuple[int, ...] = (1, 32)
    warmup_s: float = Field(default=1.0, ge=0)
    measure_s: float = Field(default=5.0, gt=0)
    model_texts: int = Field(default=128, ge=1, description="texts for the in-process ceiling")


def run(args: argparse.Namespace) -> dict[str, Any]:
    return run_embeddings_suite(EmbeddingsBenchConfig.from_args(args))


def run_embeddings_suite(
    config: EmbeddingsBenchConfig, clock: Clock = time.perf_counter
) -> dict[str, Any]:
    edge = our_application(config)
    peers = [peer_application(edge)] if config.peers else []
    batched = _max_batch_size(edge)
    most = max(config.clients)
    result: dict[str, Any] = {"config": config.model_dump(mode="json"), "sentences": SENTENCES}
    with served(config, [edge, *peers]) as (base_url, http_port):
        handle = serve.get_deployment_handle("embedding", app_name=EDGE_APP)
        targets = {OURS: Endpoint(f"{our_url(config, base_url)}/v1/embeddings", BYPASS_CACHE)}
        if config.peers:
            targets[PEER] = Endpoint(f"{base_url}{PEER_ROUTE}")
        result["batching"] = _replica_batching(handle, batched, config.deploy_timeout_s)
        result.update(asyncio.run(bench_clients(config, targets, clock)))
        result["handle_batched"] = asyncio.run(_handle_load(config, handle, most, clock))
        # Only user_config changes: Serve reconfigures the running replica, no restart.
        unbatched = our_application(config, embedding_batch_size=UNBATCHED)
        apply_applications([unbatched, *peers], http_port, config.deploy_timeout_s)
        _replica_batching(handle, UNBATCHED, config.deploy_timeout_s)
        result["unbatched"] = asyncio.run(
            bench_clients(config, {OURS: targets[OURS]}, clock, clients=(most,))
        )[f"clients_{most}"]
        result["handle_unbatched"] = asyncio.run(_handle_load(config, handle, most, clock))
    result["model_only"] = bench_model_only(config, edge, batched)
    result["batching_speedup"] = {
        "http": ratio(
            dig(result, f"clients_{most}", OURS, "requests_per_s"),
            dig(result, "unbatched", OURS, "requests_per_s"),
        ),
        "handle": ratio(
            dig(result, "handle_batched", "requests_per_s"),
            dig(result, "handle_unbatched", "requests_per_s"),
        ),
    }
    result["goals"] = goals(result, config)
    return result


def _max_batch_size(edge: Mapping[str, Any]) -> int:
    (embedding,) = [d for d in edge["deployments"] if d["name"] == "embedding"]
    return int((embedding.get("user_config") or {}).get("max_batch_size", 1))


def _replica_batching(
    handle: DeploymentHandle, max_batch_size: int, timeout_s: float
) -> dict[str, Any]:
    """What the replica itself reports, once it runs with `max_batch_size` (a redeploy returns
    before the controller has pushed the new user_config to the replica)."""

    def batching() -> dict[str, Any] | None:
        reported = handle.describe.remote().result()["batching"]
        return reported if reported["max_batch_size"] == max_batch_size else None

    return wait_until(batching, timeout_s, f"embedding max_batch_size {max_batch_size}")


async def bench_clients(
    config: EmbeddingsBenchConfig,
    targets: Mapping[str, Endpoint],
    clock: Clock,
    clients: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """Per client count, `rounds` closed-loop runs per target, targets alternating; with both
    sides, first that their answers agree (same weights, same sentence, else the race is unfair)."""
    sentences = benchmark_sentences(SENTENCES)
    bodies = {OURS: {"model": "embedding"}, PEER: {}}
    result: dict[str, Any] = {}
    async with async_client(max(config.clients)) as client:
        vectors = {}
        for name, endpoint in targets.items():
            answer = await ready(client, endpoint, {**bodies[name], "input": sentences[0]})
            vectors[name] = np.asarray(answer["data"][0]["embedding"], dtype=np.float64)
        if PEER in vectors:
            ours, peer = vectors[OURS], vectors[PEER]
            result["cosine_ours_vs_docs_pattern"] = round(
                float(ours @ peer) / float(np.linalg.norm(ours) * np.linalg.norm(peer)), 6
            )
        for count in clients or config.clients:
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
            for round_index in range(config.rounds):
                for name in rotated(list(targets), round_index):
                    endpoint, extra = targets[name], bodies[name]

                    async def send(
                        n: int, endpoint: Endpoint = endpoint, extra: dict = extra
                    ) -> None:
                        body = {**extra, "input": sentences[n % len(sentences)]}
                        await timed_post(client, endpoint, body, clock)

                    runs[name].append(
                        await closed_loop_throughput(
                            send, count, config.warmup_s, config.measure_s, clock
                        )
                    )
                    log.info("embeddings %s, %d clients: %s", name, count, runs[name][-1])
            result[f"clients_{count}"] = compare_runs(runs)
    return result


def compare_runs(runs: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each side's median requests/s and p50 over its rounds; with both sides, their ratios."""
    summary: dict[str, Any] = {}
    for name, samples in runs.items():
        rates = [s["requests_per_s"] for s in samples]
        p50s = [s["latency_ms"]["p50"] for s in samples if s["latency_ms"]["p50"] is not None]
        summary[name] = {
            "requests_per_s": round(statistics.median(rates), 2),
            "p50_ms": round(statistics.median(p50s), 2) if p50s else None,
            "rounds": [s["requests_per_s"] for s in samples],
        }
    if PEER in summary:
        ours, peer = summary[OURS], summary[PEER]
        summary["throughput_ratio"] = ratio(ours["requests_per_s"], peer["requests_per_s"])
        summary["p50_ratio"] = ratio(ours["p50_ms"], peer["p50_ms"])
    return summary


async def _handle_load(
    config: EmbeddingsBenchConfig, handle: DeploymentHandle, clients: int, clock: Clock
) -> dict[str, Any]:
    """The replica alone, fed from this process through its handle: which side limits."""
    sentences = benchmark_sentences(SENTENCES)
    client = EmbeddingClient(handle)

    async def send(n: int) -> None:
        await client.embed(EmbedRequest([sentences[n % len(sentences)]]))

    return await closed_loop_throughput(send, clients, config.warmup_s, config.measure_s, clock)


def bench_model_only(
    config: EmbeddingsBenchConfig, edge: Mapping[str, Any], batch_size: int
) -> dict[str, Any]:
    """The ceiling: the replica's own runtime in this process (same model, threads, sentences)
    at batch 1 and `batch_size`, with no Ray and no HTTP. Batching cannot buy more than this."""
    app_config = parse_app_config(edge["args"])
    session = SessionConfig(
        provider="cpu", intra_op_threads=app_config.models["embedding"].intra_op_threads
    )
    runtime = EmbeddingRuntime(app_config.model_path("embedding"), session)
    sentences = benchmark_sentences(SENTENCES)[: config.model_texts]
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
        "speedup": ratio(texts_per_s[batch_size], texts_per_s[1]),
    }


def goals(result: Mapping[str, Any], config: EmbeddingsBenchConfig) -> dict[str, GoalRecord]:
    most = max(config.clients)
    verdicts = {
        "embedding_batching_speedup": goal(
            dig(result, "batching_speedup", "http"), BATCHING_SPEEDUP_TARGET, "x requests/s"
        )
    }
    if not config.peers:
        return verdicts
    for count in config.clients:
        target = PEER_THROUGHPUT_TARGETS.get(count)
        if target is not None:
            clients = "client" if count == 1 else "clients"
            verdicts[f"embeddings_{count}_{clients}_throughput_vs_docs_pattern"] = goal(
                dig(result, f"clients_{count}", "throughput_ratio"), target, "x requests/s"
            )
    verdicts[f"embeddings_{most}_clients_p50_vs_docs_pattern"] = goal(
        dig(result, f"clients_{most}", "p50_ratio"), PEER_P50_TARGET, "x p50 latency", at_most=True
    )
    return verdicts
