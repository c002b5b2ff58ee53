"""The response cache in process, no Ray: a HIT's lookup cost on each backend and tier (memory;
SQLite and Redis, each without and with the in-process tier in front), a MISS's write-through
cost, and each answer type's stored size and encode + decode time next to pickle's, all in one
run. Redis is Debian's `redis-server` of our own (edgectl.local_services). The end-to-end HIT
latency and the repeat-request hit rate with two router replicas are the router suite's."""

from __future__ import annotations

import argparse
import asyncio
import pickle
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from benchmarks.lib.config import BenchConfig
from benchmarks.lib.goals import goal, ratio
from deployments.config import CacheConfig
from deployments.ingress.cache import ResponseCache, SharedStore
from deployments.ingress.cache.codec import decode_answer, encode_answer
from deployments.ingress.cache.redis_store import RedisStore
from deployments.ingress.cache.sqlite_store import SQLiteStore
from deployments.ingress.protocol import ChatCompletion, ModerationCreateResponse
from deployments.ingress.protocol.embeddings import EmbeddingList
from deployments.ingress.protocol.moderations import Moderation
from edgectl.loadtest.summary import latency_stats_s
from edgectl.local_services import RedisServer

NEEDS_RAY = False

# The in-process tier is kept only if a hit from it costs at most this share of a shared one.
LOCAL_TIER_TARGET = 0.5
# What an entry costs in the store, at most, next to pickling the same answer.
ENTRY_SIZE_TARGET = 1.0
EMBEDDING_DIMENSION = 384  # all-MiniLM-L6-v2's


class CacheBenchConfig(BenchConfig):
    QUICK = {"lookups": 300, "writes": 100, "codec_repeat": 300}

    lookups: int = Field(default=5000, ge=1, description="timed hits per backend and tier")
    writes: int = Field(default=1000, ge=1, description="timed write-throughs per backend")
    codec_repeat: int = Field(default=5000, ge=1, description="encode + decode rounds per type")
    max_entries: int = Field(default=10_000, ge=1, description="the stores' bound, as shipped")


def run(args: argparse.Namespace) -> dict[str, Any]:
    return run_cache_suite(CacheBenchConfig.from_args(args))


def sample_answers() -> dict[str, Any]:
    """One answer of each cached type, the size the defaults answer: one embedding row, a short
    chat completion, one moderation verdict."""
    vectors = np.random.default_rng(0).standard_normal((1, EMBEDDING_DIMENSION))
    chat = ChatCompletion.model_validate(
        {
            "id": "chatcmpl-0123456789abcdef",
            "created": 1_700_000_000,
            "model": "glm",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Paris is old. " * 16},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 24, "completion_tokens": 64, "total_tokens": 88},
        }
    )
    verdict = Moderation.from_scores(
        {"harassment": 0.012, "profanity": 0.034}, {"harassment": False, "profanity": False}
    )
    return {
        "embedding": EmbeddingList(vectors.astype(np.float32), "embedding", 9),
        "chat": chat,
        "moderation": ModerationCreateResponse(id="modr-0", model="moderation", results=[verdict]),
    }


def codec_costs(answers: dict[str, Any], repeat: int) -> dict[str, Any]:
    """Bytes and microseconds per encode + decode of each answer: ours and pickle's."""
    result = {}
    for name, answer in answers.items():
        ours, pickled = encode_answer(answer), pickle.dumps(answer)
        ours_s = timeit.timeit(lambda: decode_answer(encode_answer(answer)), number=repeat)  # noqa: B023
        pickle_s = timeit.timeit(lambda: pickle.loads(pickle.dumps(answer)), number=repeat)  # noqa: B023
        result[name] = {
            "bytes": len(ours),
            "pickle_bytes": len(pickled),
            "bytes_vs_pickle": ratio(len(ours), len(pickled)),
            "round_trip_us": round(ours_s / repeat * 1e6, 2),
            "pickle_round_trip_us": round(pickle_s / repeat * 1e6, 2),
        }
    return result


def lookup_stats(samples_s: list[float]) -> dict[str, Any]:
    """The load tester's figures (milliseconds) and the median in microseconds, where a local
    hit's cost shows."""
    return {**latency_stats_s(samples_s), "p50_us": round(statistics.median(samples_s) * 1e6, 2)}


async def _hit_latencies_s(cache: ResponseCache, key: str, lookups: int) -> list[float]:
    clock = time.perf_counter
    samples = []
    for _ in range(lookups):
        start = clock()
        found = await cache.get(key)
        samples.append(clock() - start)
        if found is None:
            raise RuntimeError("a lookup that should hit missed: the figure would be a miss's")
    return samples


async def _write_latencies_s(cache: ResponseCache, answer: Any, writes: int) -> list[float]:
    clock = time.perf_counter
    samples = []
    for index in range(writes):
        start = clock()
        await cache.put(f"write-{index}", answer)
        samples.append(clock() - start)
    return samples


async def backend_costs(
    config: CacheBenchConfig, open_store: Callable[[], SharedStore], answer: Any
) -> dict[str, Any]:
    """A hit on a replica that did not store the entry (its lookup reads the backend), with and
    without the in-process tier, and the write-through of a miss."""
    settings = CacheConfig(max_entries=config.max_entries, timeout_ms=10_000)
    writer = ResponseCache(settings, open_store())
    shared_only = ResponseCache(settings.model_copy(update={"local_entries": 0}), open_store())
    tiered = ResponseCache(settings, open_store())
    try:
        await writer.put("hit", answer)
        shared = await _hit_latencies_s(shared_only, "hit", config.lookups)
        local = await _hit_latencies_s(tiered, "hit", config.lookups)
        writes = await _write_latencies_s(writer, answer, config.writes)
    finally:
        for cache in (writer, shared_only, tiered):
            await cache.close()
    return {
        "hit_shared": lookup_stats(shared),
        "hit_local_tier": lookup_stats(local),
        "write_through": lookup_stats(writes),
    }


async def memory_costs(config: CacheBenchConfig, answer: Any) -> dict[str, Any]:
    cache = ResponseCache(CacheConfig(backend="memory", max_entries=config.max_entries))
    await cache.put("hit", answer)
    return {"hit": lookup_stats(await _hit_latencies_s(cache, "hit", config.lookups))}


def run_cache_suite(config: CacheBenchConfig) -> dict[str, Any]:
    answers = sample_answers()
    embedding = answers["embedding"]
    data_dir = Path(tempfile.mkdtemp(prefix="edge-cache-bench-"))
    redis = RedisServer.start()
    try:
        backends = {
            "memory": asyncio.run(memory_costs(config, embedding)),
            "sqlite": asyncio.run(
                backend_costs(
                    config,
                    lambda: SQLiteStore(
                        data_dir / "response-cache.sqlite3", config.max_entries, 10_000
                    ),
                    embedding,
                )
            ),
            "redis": asyncio.run(
                backend_costs(
                    config,
                    lambda: RedisStore(
                        redis.url,
                        password=None,
                        key_prefix="bench:",
                        max_entries=config.max_entries,
                        timeout_ms=10_000,
                    ),
                    embedding,
                )
            ),
        }
    finally:
        redis.remove()
    codec = codec_costs(answers, config.codec_repeat)
    goals = {
        f"local_tier_vs_{name}_hit_p50": goal(
            ratio(
                backends[name]["hit_local_tier"]["p50_us"], backends[name]["hit_shared"]["p50_us"]
            ),
            LOCAL_TIER_TARGET,
            "x",
            at_most=True,
            note="an embedding HIT from the in-process tier over one read from the backend",
        )
        for name in ("sqlite", "redis")
    }
    goals["embedding_entry_bytes_vs_pickle"] = goal(
        codec["embedding"]["bytes_vs_pickle"], ENTRY_SIZE_TARGET, "x", at_most=True
    )
    return {
        "config": config.model_dump(mode="json"),
        "answer": "one 384-dim float32 embedding row (the lookups and writes)",
        "backends": backends,
        "codec": codec,
        "goals": goals,
    }
