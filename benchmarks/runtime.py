"""The runtime suite, in this process (no Ray): the model layer's own figures. ONNX Runtime vs
PyTorch sentence embeddings, KV-cache vs full-recompute decoding, and 8 concurrent streams vs 1
for each chat default with the engine's step profile (graph vs per-token Python vs the executor
round trip), so each decode-overhead lever shows where it moved time."""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from pydantic import Field

from benchmarks.lib.config import BenchConfig, Provider
from benchmarks.lib.corpus import benchmark_sentences, chat_messages
from benchmarks.lib.goals import GoalRecord, goal, ratio
from benchmarks.lib.pytorch import EmbedFn, pytorch_embedders
from deployments.contracts.sampling_params import SamplingParams
from deployments.export.defaults import CHAT_DEFAULTS
from deployments.replica.engine.embedding import EmbeddingRuntime
from deployments.replica.engine.llm import LLMRuntime, StepProfile
from deployments.replica.engine.session import SessionConfig

log = logging.getLogger(__name__)

NEEDS_RAY = False

Clock = Callable[[], float]

# The goals this suite checks (ratios of throughputs measured in the same run).
EMBEDDING_SPEEDUP_TARGET = 1.5  # ONNX Runtime vs PyTorch sentences/s at GOAL_BATCH_SIZE
GOAL_BATCH_SIZE = 32
KV_CACHE_SPEEDUP_TARGET = 5.0  # cached decode vs full recompute tokens/s
CONCURRENCY_SPEEDUP_TARGET = 4.0  # 8 concurrent streams vs 1, tokens/s, our runtime

CONCURRENT_TEMPERATURE = 0.7
# The engine books its last round trip just after a run's final chunk: this long lets it land in
# that run's profile, not the next one's.
ENGINE_SETTLE_S = 0.05


class RuntimeBenchConfig(BenchConfig):
    QUICK = {"repetitions": 1, "sentences": 32, "concurrency_repetitions": 2}

    provider: Provider = "cpu"
    threads: int = Field(default=2, ge=1, description="ORT intra-op threads = torch threads")
    repetitions: int = Field(default=5, ge=1, description="timed runs per measurement; median")
    sentences: int = Field(default=128, ge=1)
    batch_sizes: tuple[int, ...] = (1, GOAL_BATCH_SIZE)
    new_tokens: int = Field(default=128, ge=2)
    streams: int = Field(default=8, ge=2)
    # Interleaved 1- and 8-stream runs: a run is 10-20 ms, so on a shared machine three of them
    # moved the ratio by +-0.3.
    concurrency_repetitions: int = Field(default=15, ge=1)
    chat_models: tuple[str, ...] = CHAT_DEFAULTS

    def session_config(self) -> SessionConfig:
        return SessionConfig(provider=self.provider, intra_op_threads=self.threads)


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = RuntimeBenchConfig.from_args(args, provider=args.provider, threads=args.threads)
    return run_runtime_suite(config)


def run_runtime_suite(
    config: RuntimeBenchConfig, clock: Clock = time.perf_counter
) -> dict[str, Any]:
    embedding = bench_embedding(config, clock)
    chat = {name: bench_chat_model(config, name, clock) for name in config.chat_models}
    goals: dict[str, GoalRecord] = {
        "embedding_onnx_vs_pytorch_batch32": goal(
            embedding["goal_ratio"],
            EMBEDDING_SPEEDUP_TARGET,
            "x sentences/s",
            missing=f"batch {GOAL_BATCH_SIZE} not among the measured sizes",
            details={"baseline": embedding["goal_baseline"]},
        )
    }
    for name, result in chat.items():
        goals[f"{name}_kv_cache_vs_recompute"] = goal(
            result["kv_cache"]["speedup"], KV_CACHE_SPEEDUP_TARGET, "x tokens/s"
        )
        goals[f"{name}_{config.streams}_streams_vs_1"] = goal(
            result["concurrency"]["speedup"], CONCURRENCY_SPEEDUP_TARGET, "x tokens/s"
        )
    return {
        "config": config.model_dump(mode="json"),
        "embedding": embedding,
        "chat": chat,
        "goals": goals,
    }


def _median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


def _rounded(samples: Sequence[float]) -> list[float]:
    return [round(s, 4) for s in samples]


# ---- embeddings --------------------------------------------------------------------------------


def _parity(reference: np.ndarray, other: np.ndarray) -> dict[str, float]:
    cosines = (reference * other).sum(axis=1) / (
        np.linalg.norm(reference, axis=1) * np.linalg.norm(other, axis=1)
    )
    return {
        "max_abs_diff": float(np.abs(reference - other).max()),
        "min_cosine": round(float(cosines.min()), 7),
    }


def bench_embedding(config: RuntimeBenchConfig, clock: Clock) -> dict[str, Any]:
    sentences = benchmark_sentences(config.sentences)
    runtime = EmbeddingRuntime(config.models_dir / "embedding", config.session_config())
    embedders: dict[str, EmbedFn] = {"onnxruntime": lambda texts: runtime.embed(texts).vectors}
    log.info("embedding: loading the PyTorch baseline")
    embedders.update(pytorch_embedders(runtime.tokenizer, config.threads))

    sample = sentences[:GOAL_BATCH_SIZE]
    onnx_vectors = embedders["onnxruntime"](sample)  # also a warm-up of each backend
    parity = {
        name: _parity(onnx_vectors, embed(sample))
        for name, embed in embedders.items()
        if name != "onnxruntime"
    }

    by_batch: dict[str, Any] = {}
    for batch_size in config.batch_sizes:
        batches = [sentences[i : i + batch_size] for i in range(0, len(sentences), batch_size)]
        for embed in embedders.values():
            embed(batches[0])  # warm-up at this shape
        seconds: dict[str, list[float]] = {name: [] for name in embedders}
        # Backends alternate within each repetition, so load from other processes hits both.
        for _ in range(config.repetitions):
            for name, embed in embedders.items():
                start = clock()
                for batch in batches:
                    embed(batch)
                seconds[name].append(clock() - start)
        per_backend: dict[str, dict[str, Any]] = {
            name: {
                "sentences_per_s": round(len(sentences) / _median(times), 2),
                "seconds": _rounded(times),
            }
            for name, times in seconds.items()
        }
        onnx_rate = per_backend["onnxruntime"]["sentences_per_s"]
        by_batch[f"batch_{batch_size}"] = {
            **per_backend,
            "onnx_speedup_vs": {
                name: ratio(onnx_rate, result["sentences_per_s"])
                for name, result in per_backend.items()
                if name != "onnxruntime"
            },
        }
        log.info("embedding batch %d: %s", batch_size, by_batch[f"batch_{batch_size}"])

    goal_ratio, goal_baseline = None, None
    goal_key = f"batch_{GOAL_BATCH_SIZE}"
    if goal_key in by_batch:
        speedups = by_batch[goal_key]["onnx_speedup_vs"]
        goal_baseline = min(speedups, key=speedups.__getitem__)  # the fastest PyTorch variant
        goal_ratio = speedups[goal_baseline]
    return {
        "sentences": len(sentences),
        "mean_tokens": round(float(np.mean(runtime.check(sentences))), 1),
        "threads": config.threads,
        "provider": runtime.provider,
        "parity_vs_onnx": parity,
        **by_batch,
        "goal_ratio": goal_ratio,
        "goal_baseline": goal_baseline,
    }


# ---- chat models -------------------------------------------------------------------------------


def bench_chat_model(config: RuntimeBenchConfig, name: str, clock: Clock) -> dict[str, Any]:
    runtime = LLMRuntime(
        config.models_dir / name, config.session_config(), max_batch_size=config.streams
    )
    try:
        prompt = runtime.tokenizer.encode_chat(chat_messages())
        kv_cache = _bench_kv_cache(runtime, prompt, config, clock)
        log.info("%s kv cache: %s", name, kv_cache)
        concurrency = asyncio.run(_bench_concurrency(runtime, config, clock))
        log.info("%s concurrency: %s", name, concurrency)
    finally:
        runtime.close()
    return {
        "architecture": runtime.manifest.architecture,
        "provider": runtime.session.provider,
        "prompt_tokens": len(prompt),
        "kv_cache": kv_cache,
        "concurrency": concurrency,
    }


def _bench_kv_cache(
    runtime: LLMRuntime, prompt: list[int], config: RuntimeBenchConfig, clock: Clock
) -> dict[str, Any]:
    graph, n = runtime.graph, config.new_tokens
    modes: dict[str, Callable[[], list[int]]] = {
        "cached": lambda: graph.greedy_cached(prompt, n),
        "full_recompute": lambda: graph.greedy_full_recompute(prompt, n),
    }
    tokens = {mode: generate() for mode, generate in modes.items()}  # warm-up
    seconds: dict[str, list[float]] = {mode: [] for mode in modes}
    for _ in range(config.repetitions):
        for mode, generate in modes.items():
            start = clock()
            generate()
            seconds[mode].append(clock() - start)
    rates = {mode: n / _median(times) for mode, times in seconds.items()}
    return {
        "new_tokens": n,
        # Greedy either way: the cache must not change a single token.
        "same_tokens": tokens["cached"] == tokens["full_recompute"],
        **{
            mode: {"tokens_per_s": round(rates[mode], 1), "seconds": _rounded(seconds[mode])}
            for mode in modes
        },
        "speedup": ratio(rates["cached"], rates["full_recompute"]),
    }


async def _bench_concurrency(
    runtime: LLMRuntime, config: RuntimeBenchConfig, clock: Clock
) -> dict[str, Any]:
    """Sampled requests, 1 stream then `streams` at once (continuous batching), in interleaved
    pairs; the ratio is the median over pairs, since a pair sees the same load on a shared
    machine. Each side's engine step profile is summed over its runs."""
    messages = chat_messages()
    many = f"{config.streams}_streams"
    sides = {"1_stream": 1, many: config.streams}

    def params(seed: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=config.new_tokens, temperature=CONCURRENT_TEMPERATURE, seed=seed
        )

    await runtime.complete(messages, params(0))  # warm-up
    await asyncio.sleep(ENGINE_SETTLE_S)
    rates: dict[str, list[float]] = {side: [] for side in sides}
    profiles: dict[str, StepProfile] = {side: StepProfile() for side in sides}
    max_batch_seen = 0
    for repetition in range(config.concurrency_repetitions):
        for side, streams in sides.items():
            runtime.profile = StepProfile()
            started = clock()
            done = await asyncio.gather(
                *(runtime.complete(messages, params(100 * repetition + i)) for i in range(streams))
            )
            wall = clock() - started
            await asyncio.sleep(ENGINE_SETTLE_S)
            rates[side].append(sum(c.completion_tokens for c in done) / wall)
            max_batch_seen = max(max_batch_seen, runtime.max_batch_seen)
            total = profiles[side]
            for field in ("steps", "tokens", "graph_s", "step_s", "wall_s", "hops"):
                setattr(total, field, getattr(total, field) + getattr(runtime.profile, field))
    paired = [m / one for one, m in zip(rates["1_stream"], rates[many], strict=True)]
    return {
        "new_tokens": config.new_tokens,
        "repetitions": config.concurrency_repetitions,
        "tokens_per_s": {side: round(_median(r), 1) for side, r in rates.items()},
        "max_batch_seen": max_batch_seen,
        "step_profile": {side: profile.per_step_ms() for side, profile in profiles.items()},
        "speedup": round(_median(paired), 3),
    }
