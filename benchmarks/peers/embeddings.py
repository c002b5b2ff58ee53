"""Embeddings, ours vs the docs-pattern PyTorch deployment: closed-loop clients (1 and 32) in
alternating rounds, requests/s and p50 of each side and their ratios."""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping
from typing import Any

import numpy as np

from benchmarks.http_load import Endpoint, async_client, closed_loop_throughput, timed_post
from benchmarks.models import benchmark_sentences
from benchmarks.peers.common import PEER_EMBEDDING, Clock, ratio, ready, rotated
from benchmarks.peers.config import PeersBenchConfig
from benchmarks.router import BYPASS_CACHE

log = logging.getLogger(__name__)


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
            response = await ready(client, endpoint, body)
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
                for name in rotated(list(targets), round_index):
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
    summary["throughput_ratio"] = ratio(ours["requests_per_s"], peer["requests_per_s"])
    summary["p50_ratio"] = (
        ratio(ours["p50_ms"], peer["p50_ms"]) if ours["p50_ms"] and peer["p50_ms"] else None
    )
    return summary
