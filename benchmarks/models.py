"""The model-layer suite: ONNX Runtime vs PyTorch sentence embeddings, KV-cache vs full-recompute
decoding and 8 concurrent vs 1 stream for each chat default, and load + warm-up time per model."""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.resources
import logging
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from deployments.runtime.embedding import EmbeddingRuntime, SentenceTokenizer
from deployments.runtime.llm import Completion, LLMRuntime
from deployments.runtime.moderation import ModerationRuntime
from deployments.runtime.sampling import SamplingParams
from deployments.runtime.session import SessionConfig

log = logging.getLogger(__name__)

Clock = Callable[[], float]
EmbedFn = Callable[[Sequence[str]], np.ndarray]

# The goals this suite checks (ratios of throughputs measured in the same run).
EMBEDDING_SPEEDUP_TARGET = 1.5  # ONNX Runtime vs PyTorch sentences/s at GOAL_BATCH_SIZE
GOAL_BATCH_SIZE = 32
KV_CACHE_SPEEDUP_TARGET = 5.0  # cached decode vs full recompute tokens/s
CONCURRENCY_SPEEDUP_TARGET = 3.0  # 8 concurrent streams vs the same requests one at a time

CHAT_MODELS = ("glm", "kimi")
CHAT_PROMPT = ({"role": "user", "content": "Tell me a short story about a train that runs late."},)
CONCURRENT_TEMPERATURE = 0.7
SENTENCE_CORPUS = ("deployments.export.corpus", "english.txt")

# --quick: the same measurements at smoke size (one repetition, fewer sentences).
QUICK_SIZES: Mapping[str, int] = {"repetitions": 1, "sentences": 32, "load_repetitions": 1}


class ModelsBenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models_dir: Path
    provider: Literal["cpu", "auto", "cuda"] = "cpu"
    threads: int = Field(default=2, ge=1, description="ORT intra-op threads = torch threads")
    repetitions: int = Field(default=5, ge=1, description="timed runs per measurement; median")
    sentences: int = Field(default=128, ge=1)
    batch_sizes: tuple[int, ...] = (1, GOAL_BATCH_SIZE)
    new_tokens: int = Field(default=128, ge=1)
    streams: int = Field(default=8, ge=1)
    load_repetitions: int = Field(default=3, ge=1)
    chat_models: tuple[str, ...] = CHAT_MODELS

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ModelsBenchConfig:
        config = cls(models_dir=Path(args.models_dir), provider=args.provider, threads=args.threads)
        return config.model_copy(update=dict(QUICK_SIZES)) if args.quick else config

    def session_config(self, provider: str | None = None) -> SessionConfig:
        return SessionConfig(
            provider=provider or self.provider,  # type: ignore[arg-type]
            intra_op_threads=self.threads,
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = ModelsBenchConfig.from_args(args)
    return run_models_suite(config)


def run_models_suite(config: ModelsBenchConfig, clock: Clock = time.perf_counter) -> dict[str, Any]:
    embedding = bench_embedding(config, clock)
    chat = {name: bench_chat_model(config, name, clock) for name in config.chat_models}
    load = bench_load(config, clock)
    goals = {
        "embedding_onnx_vs_pytorch_batch32": _goal(
            embedding["goal"]["ratio"], EMBEDDING_SPEEDUP_TARGET, "x sentences/s"
        )
    }
    for name, result in chat.items():
        goals[f"{name}_kv_cache_vs_recompute"] = _goal(
            result["kv_cache"]["speedup"], KV_CACHE_SPEEDUP_TARGET, "x tokens/s"
        )
        goals[f"{name}_{config.streams}_streams_vs_1"] = _goal(
            result["concurrency"]["speedup"], CONCURRENCY_SPEEDUP_TARGET, "x tokens/s"
        )
    return {
        "config": config.model_dump(mode="json"),
        "embedding": embedding,
        "chat": chat,
        "load": load,
        "goals": goals,
    }


def _goal(value: float | None, target: float, unit: str) -> dict[str, Any]:
    """One goal's verdict; a value that was not measured (None) is not met."""
    met = value is not None and value >= target
    shown = None if value is None else round(value, 3)
    return {"value": shown, "target": target, "met": met, "unit": unit}


def _median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


def _rounded(samples: Sequence[float]) -> list[float]:
    return [round(s, 4) for s in samples]


# ---- embeddings --------------------------------------------------------------------------------


def benchmark_sentences(count: int) -> list[str]:
    """`count` real English sentences of varied length (repeated if the corpus is shorter)."""
    package, name = SENTENCE_CORPUS
    text = (importlib.resources.files(package) / name).read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return [lines[i % len(lines)] for i in range(count)]


def pytorch_embedders(tokenizer: SentenceTokenizer, threads: int) -> dict[str, EmbedFn]:
    """The packaged MiniLM in PyTorch, loaded by the exporter's own code: eager attention (what
    was exported) and SDPA (transformers' default), so the goal is judged against the faster."""
    import torch
    from transformers import PreTrainedModel

    from deployments.export.embedding import MeanPooledEncoder, load_encoder, resolve_checkpoint

    torch.set_num_threads(threads)
    checkpoint = resolve_checkpoint(None)
    eager = load_encoder(checkpoint)
    sdpa = load_encoder(checkpoint)
    assert isinstance(sdpa, PreTrainedModel)  # load_encoder's return type is the nn.Module base
    sdpa.set_attn_implementation("sdpa")

    def embedder(encoder: torch.nn.Module) -> EmbedFn:
        pooled: torch.nn.Module = MeanPooledEncoder(encoder).eval()

        def embed(texts: Sequence[str]) -> np.ndarray:
            # Same tokenizer and padding as the ONNX path, so only the forward pass differs.
            batch = tokenizer.batch(texts)
            with torch.inference_mode():
                return pooled(
                    torch.from_numpy(batch.input_ids), torch.from_numpy(batch.attention_mask)
                ).numpy()

        return embed

    return {"pytorch_eager": embedder(eager), "pytorch_sdpa": embedder(sdpa)}


def _parity(reference: np.ndarray, other: np.ndarray) -> dict[str, float]:
    cosines = (reference * other).sum(axis=1) / (
        np.linalg.norm(reference, axis=1) * np.linalg.norm(other, axis=1)
    )
    return {
        "max_abs_diff": float(np.abs(reference - other).max()),
        "min_cosine": round(float(cosines.min()), 7),
    }


def bench_embedding(config: ModelsBenchConfig, clock: Clock) -> dict[str, Any]:
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
                name: round(onnx_rate / result["sentences_per_s"], 3)
                for name, result in per_backend.items()
                if name != "onnxruntime"
            },
        }
        log.info("embedding batch %d: %s", batch_size, by_batch[f"batch_{batch_size}"])

    goal_key = f"batch_{GOAL_BATCH_SIZE}"
    goal: dict[str, Any] = {
        "ratio": None,  # batch 32 not among the measured sizes
        "baseline": None,
        "target": EMBEDDING_SPEEDUP_TARGET,
        "goal_met": False,
    }
    if goal_key in by_batch:
        speedups = by_batch[goal_key]["onnx_speedup_vs"]
        baseline = min(speedups, key=speedups.__getitem__)  # the fastest PyTorch variant
        goal = {
            "ratio": speedups[baseline],
            "baseline": baseline,
            "target": EMBEDDING_SPEEDUP_TARGET,
            "goal_met": speedups[baseline] >= EMBEDDING_SPEEDUP_TARGET,
        }
    return {
        "sentences": len(sentences),
        "mean_tokens": round(float(np.mean(runtime.check(sentences))), 1),
        "threads": config.threads,
        "provider": runtime.provider,
        "parity_vs_onnx": parity,
        **by_batch,
        "goal": goal,
    }


# ---- chat models -------------------------------------------------------------------------------


def bench_chat_model(config: ModelsBenchConfig, name: str, clock: Clock) -> dict[str, Any]:
    runtime = LLMRuntime(
        config.models_dir / name, config.session_config(), max_batch_size=config.streams
    )
    try:
        prompt = runtime.tokenizer.encode_chat(list(CHAT_PROMPT))
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
    runtime: LLMRuntime, prompt: list[int], config: ModelsBenchConfig, clock: Clock
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
        "speedup": round(rates["cached"] / rates["full_recompute"], 3),
    }


async def _bench_concurrency(
    runtime: LLMRuntime, config: ModelsBenchConfig, clock: Clock
) -> dict[str, Any]:
    """The same `streams` sampled requests, one at a time vs all at once (continuous batching)."""
    params = [
        SamplingParams(max_tokens=config.new_tokens, temperature=CONCURRENT_TEMPERATURE, seed=seed)
        for seed in range(config.streams)
    ]
    messages = list(CHAT_PROMPT)

    async def one_stream() -> list[Completion]:
        return [await runtime.complete(messages, p) for p in params]

    async def concurrent() -> list[Completion]:
        return list(await asyncio.gather(*(runtime.complete(messages, p) for p in params)))

    modes = {"one_stream": one_stream, f"{config.streams}_streams": concurrent}
    await runtime.complete(messages, params[0])  # warm-up
    samples: dict[str, list[tuple[float, int, int]]] = {mode: [] for mode in modes}
    for _ in range(config.repetitions):
        for mode, generate in modes.items():
            steps_before = runtime.steps
            start = clock()
            completions = await generate()
            elapsed = clock() - start
            tokens = sum(c.completion_tokens for c in completions)
            samples[mode].append((elapsed, tokens, runtime.steps - steps_before))
    result: dict[str, Any] = {"requests": config.streams, "max_tokens": config.new_tokens}
    rates: dict[str, float] = {}
    for mode, runs in samples.items():
        per_run = [tokens / elapsed for elapsed, tokens, _ in runs]
        rates[mode] = _median(per_run)
        result[mode] = {
            "tokens_per_s": round(rates[mode], 1),
            "completion_tokens": [tokens for _, tokens, _ in runs],
            "engine_steps": [steps for _, _, steps in runs],
            "seconds": _rounded([elapsed for elapsed, _, _ in runs]),
        }
    result["max_batch_seen"] = runtime.max_batch_seen
    result["speedup"] = round(rates[f"{config.streams}_streams"] / rates["one_stream"], 3)
    return result


# ---- load + warm-up ----------------------------------------------------------------------------


def bench_load(config: ModelsBenchConfig, clock: Clock) -> dict[str, Any]:
    """Construct each default runtime a few times: graph load, warm-up, the constructor's wall."""
    factories: dict[str, Callable[[], Any]] = {
        name: functools.partial(LLMRuntime, config.models_dir / name, config.session_config())
        for name in config.chat_models
    }
    factories["embedding"] = lambda: EmbeddingRuntime(
        config.models_dir / "embedding", config.session_config()
    )
    # Its graph's ops are CPU-only, so the runtime itself never puts it on a GPU.
    factories["moderation"] = lambda: ModerationRuntime(
        config.models_dir / "moderation", config.session_config("cpu")
    )
    results: dict[str, Any] = {}
    for name, factory in factories.items():
        runs: list[tuple[float, float, float]] = []
        for _ in range(config.load_repetitions):
            start = clock()
            runtime = factory()
            wall = clock() - start
            runs.append((runtime.session.load_s, runtime.session.warmup_s, wall))
            if isinstance(runtime, LLMRuntime):
                runtime.close()
        load_s, warmup_s, wall_s = (list(column) for column in zip(*runs, strict=True))
        results[name] = {
            "load_s": round(_median(load_s), 4),
            "warmup_s": round(_median(warmup_s), 4),
            "total_wall_s": round(_median(wall_s), 4),
            "first_total_wall_s": round(wall_s[0], 4),
            "runs": [
                {"load_s": round(a, 4), "warmup_s": round(b, 4), "total_wall_s": round(c, 4)}
                for a, b, c in runs
            ],
        }
        log.info("load %s: %s", name, {k: v for k, v in results[name].items() if k != "runs"})
    return results
