"""Our chat runtime alone, in this process: tokens/s of 8 concurrent streams vs 1, the decode
step's time at batch 1, and the engine's step profile (graph vs per-token Python vs the executor
round trip), so each decode-overhead lever shows where it moved time."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.models import CHAT_PROMPT
from deployments.runtime.llm import LLMRuntime, StepProfile
from deployments.runtime.sampling import SamplingParams
from deployments.runtime.session import SessionConfig

CONCURRENT_STREAMS = 8
# Interleaved 1- and 8-stream runs: a run is 10-20 ms, so on a shared machine three of them
# moved the ratio by +-0.3.
REPETITIONS = 15
ENGINE_SETTLE_S = 0.05


def decode_profile(model_dir: Path, threads: int, new_tokens: int) -> dict[str, Any]:
    runtime = LLMRuntime(
        model_dir,
        SessionConfig(provider="cpu", intra_op_threads=threads),
        max_batch_size=CONCURRENT_STREAMS,
    )
    try:
        return asyncio.run(_profile(runtime, new_tokens)) | {
            "step_ms_p50_batch_1": _decode_step_ms(runtime, new_tokens),
            "intra_op_threads": threads,
        }
    finally:
        runtime.close()


def _decode_step_ms(runtime: LLMRuntime, steps: int) -> float:
    """One batch-1 KV-cached decode step of the graph, p50 (what a token cannot go below)."""
    prompt = runtime.tokenizer.encode_chat(list(CHAT_PROMPT))
    _, cache = runtime.graph.prefill(prompt)
    times, token = [], prompt[-1]
    for _ in range(steps):
        started = time.perf_counter()
        _, (cache,) = runtime.graph.decode([token], [cache])
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1e3, 3)


async def _profile(runtime: LLMRuntime, new_tokens: int) -> dict[str, Any]:
    messages = list(CHAT_PROMPT)

    def params(seed: int) -> SamplingParams:
        return SamplingParams(max_tokens=new_tokens, temperature=0.7, seed=seed)

    await runtime.complete(messages, params(0))  # warm-up
    await asyncio.sleep(ENGINE_SETTLE_S)
    rates: dict[str, list[float]] = {"1_stream": [], f"{CONCURRENT_STREAMS}_streams": []}
    profiles: dict[str, StepProfile] = {name: StepProfile() for name in rates}
    for repetition in range(REPETITIONS):
        for name, streams in (
            ("1_stream", 1),
            (f"{CONCURRENT_STREAMS}_streams", CONCURRENT_STREAMS),
        ):
            runtime.profile = StepProfile()
            started = time.perf_counter()
            done = await asyncio.gather(
                *(runtime.complete(messages, params(100 * repetition + i)) for i in range(streams))
            )
            wall = time.perf_counter() - started
            # The engine books its last round trip just after the final chunk: let it, so that
            # it lands in this run's profile, not the next one's.
            await asyncio.sleep(ENGINE_SETTLE_S)
            rates[name].append(sum(c.completion_tokens for c in done) / wall)
            total = profiles[name]
            for field in ("steps", "tokens", "graph_s", "step_s", "wall_s", "hops"):
                setattr(total, field, getattr(total, field) + getattr(runtime.profile, field))
    medians = {name: statistics.median(r) for name, r in rates.items()}
    # Each 8-stream run against the 1-stream run just before it (a pair sees the same load on
    # a shared machine), the median of those ratios.
    paired = [
        many / one
        for one, many in zip(rates["1_stream"], rates[f"{CONCURRENT_STREAMS}_streams"], strict=True)
    ]
    return {
        "new_tokens": new_tokens,
        "tokens_per_s": {name: round(rate, 1) for name, rate in medians.items()},
        "speedup_8_vs_1": round(statistics.median(paired), 3),
        "step_profile": {name: profile.per_step_ms() for name, profile in profiles.items()},
    }
