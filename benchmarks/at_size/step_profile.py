"""Where a chat engine's step time goes, in process: the chat replica's `LLMRuntime` built from a
model directory as the replica builds it, without Ray or HTTP, so what is timed is the engine.

    python -m benchmarks.at_size.step_profile --model-dir models-large/glm --threads 2 \\
        --batches 1 16 --runs 3 --ort-ops --stall-chunks 256 64

- `decode`: per batch size, that many requests at once (whole answers, sampled at temperature
  0.7 with a seed each, as the at-size suite's bodies are), the sizes alternating run by run, so
  the machine's other load falls on all alike. Medians over runs of tokens/s and, per engine step
  (a decode step or a newcomer's prefill), the graph's ms (ONNX Runtime's run), the rest of the
  step on the engine thread (inputs, sampling, detokenising), and the hop to the event loop;
  beside them `sample_batch` alone on logits of the step's shape: sampling's share.
- `ort_ops` (`--ort-ops`): a second session with ONNX Runtime's profiler on, one burst per batch
  size; per decode batch size the ms per step of each op type, and the MatMuls by input shape
  (the head is the one whose input is [batch, hidden]: last position only).
- `stall` (`--stall-chunks`, `--stall-shares`): `--stall-streams` running streams, then a prompt
  of `--stall-prompt-tokens` tokens; per prefill chunk size and pacer share (`chunk@share`), the
  prompt's TTFT and the running streams' largest and p99 gap between two tokens during its
  prefill over their median gap before it.

Writes one JSON document to stdout. `--threads` defaults to 2: the at-size machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.at_size.load import long_prompt
from benchmarks.lib.corpus import chat_messages
from deployments.contracts.sampling_params import SamplingParams
from deployments.contracts.session_config import SessionConfig
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.sampling import SamplingState, sample_batch
from deployments.replica.engine.slot_step_runner import SlotStepRunner
from deployments.replica.engine.step_profile import StepProfile
from deployments.replica.engine.step_runner import DecoderStepRunner

TEMPERATURE = 0.7  # the at-size suite's request bodies


@dataclass(frozen=True)
class Options:
    model_dir: Path
    threads: int
    batches: tuple[int, ...]
    runs: int
    max_tokens: int
    ort_ops: bool
    stall_chunks: tuple[int, ...]
    stall_shares: tuple[float | None, ...]  # the pacer's step share per variant; None: unpaced
    stall_streams: int
    stall_prompt_tokens: int


def open_runtime(options: Options, profile_file_prefix: str | None = None) -> LLMRuntime:
    """As a chat replica opens its model (`deployments/app.py`: CPU, the model's threads)."""
    config = SessionConfig(
        provider="cpu",
        intra_op_threads=options.threads,
        inter_op_threads=1,
        profile_file_prefix=profile_file_prefix,
    )
    # Room for the stall's running streams and its long prompt beside them.
    batch_limit = max(*options.batches, options.stall_streams + 1)
    return LLMRuntime(options.model_dir, config, max_batch_size=batch_limit)


def params(seed: int, max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=TEMPERATURE, seed=seed, max_tokens=max_tokens)


async def burst(runtime: LLMRuntime, requests: int, max_tokens: int) -> dict[str, float]:
    """`requests` whole answers at once: tokens/s and the engine's per-step split meanwhile."""
    profile = runtime.runner.profile
    before = StepProfile(**vars(profile))
    started = time.perf_counter()
    answers = await asyncio.gather(
        *(runtime.complete(chat_messages(), params(i, max_tokens)) for i in range(requests))
    )
    wall_s = time.perf_counter() - started
    during = StepProfile(
        **{name: value - getattr(before, name) for name, value in vars(profile).items()}
    )
    tokens = sum(answer.completion_tokens for answer in answers)
    return {"tokens_per_s": tokens / wall_s, **during.per_step_ms()}


def sampling_ms(vocab: int, rows: int, repeats: int = 10) -> float:
    """`sample_batch` alone on [rows, vocab] logits, the decode bursts' parameters: median ms."""
    logits = np.random.default_rng(0).standard_normal((rows, vocab)).astype(np.float32)
    states = [SamplingState(params(i, 1), vocab) for i in range(rows)]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        sample_batch(logits, states)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1e3, 3)


async def decode(runtime: LLMRuntime, options: Options) -> dict[str, Any]:
    """Per batch size: the medians over `runs` bursts, the sizes' order reversed every run."""
    await burst(runtime, max(options.batches), 2)  # warm: every row count bound once
    runs: dict[int, list[dict[str, float]]] = defaultdict(list)
    for run in range(options.runs):
        order = options.batches if run % 2 == 0 else options.batches[::-1]
        for size in order:
            runs[size].append(await burst(runtime, size, options.max_tokens))
    return {
        str(size): {
            **{
                key: round(statistics.median(r[key] for r in runs[size]), 3)
                for key in runs[size][0]
            },
            "sample_batch_ms": sampling_ms(runtime.vocab_size, size),
        }
        for size in options.batches
    }


def _run_shape(nodes: Sequence[dict[str, Any]]) -> tuple[int, int] | None:
    """(batch, new tokens) of one graph run: the first node fed an int64 [batch, seq] tensor
    (the embedding's Gather of `input_ids`)."""
    for node in nodes:
        for shapes in node["args"].get("input_type_shape", []):
            for dtype, shape in shapes.items():
                if dtype == "int64" and len(shape) == 2:
                    return int(shape[0]), int(shape[1])
    return None


@dataclass
class DecodeOps:
    """One decode batch size's graph runs in an ONNX Runtime profile, microseconds summed."""

    steps: int = 0
    run_us: int = 0
    op_us: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    matmul_us: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def per_step_ms(self, top: int) -> dict[str, Any]:
        def heaviest(totals: dict[str, int]) -> dict[str, float]:
            ranked = sorted(totals.items(), key=lambda item: -item[1])[:top]
            return {name: round(us / self.steps / 1e3, 3) for name, us in ranked}

        return {
            "steps": self.steps,
            "run_ms": round(self.run_us / self.steps / 1e3, 3),
            "ops_ms": heaviest(self.op_us),
            "matmuls_ms": heaviest(self.matmul_us),
        }


def summarise_ort_profile(events: Sequence[dict[str, Any]], top: int = 8) -> dict[str, Any]:
    """ONNX Runtime's profile events per decode batch size (runs of one new token per row):
    ms per step of each op type, and of the MatMuls by input shapes (the heaviest `top`)."""
    runs = [e for e in events if e.get("cat") == "Session" and e["name"] == "model_run"]
    kernels = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    by_batch: dict[int, DecodeOps] = {}
    for run in runs:
        end = run["ts"] + run["dur"]
        nodes = [k for k in kernels if run["ts"] <= k["ts"] <= end]
        shape = _run_shape(nodes)
        if shape is None or shape[1] != 1:
            continue  # a prefill: its shape is a prompt's
        ops = by_batch.setdefault(shape[0], DecodeOps())
        ops.steps += 1
        ops.run_us += run["dur"]
        for node in nodes:
            op = node["args"]["op_name"]
            ops.op_us[op] += node["dur"]
            if "MatMul" in op:
                shapes = json.dumps(node["args"].get("input_type_shape"))
                ops.matmul_us[f"{op} {shapes}"] += node["dur"]
    return {str(batch): ops.per_step_ms(top) for batch, ops in sorted(by_batch.items())}


async def ort_ops(options: Options) -> dict[str, Any]:
    """One burst per batch size on a profiled session of its own, then its profile summarised."""
    with tempfile.TemporaryDirectory() as folder:
        runtime = open_runtime(options, f"{folder}/ort")
        try:
            for size in options.batches:
                await burst(runtime, size, min(options.max_tokens, 8))
            profile = Path(runtime.session.session.end_profiling())
            return summarise_ort_profile(json.loads(profile.read_text()))
        finally:
            runtime.close()


async def _timed_stream(
    runtime: LLMRuntime, prompt: Any, sampling: SamplingParams, stop: asyncio.Event | None
) -> list[float]:
    """When each chunk arrived; the stream is left (its slot freed) once `stop` is set."""
    times = []
    stream = runtime.stream(prompt, sampling)
    assert isinstance(stream, AsyncGenerator)  # `_generate`'s: it can be closed
    # Closed on leaving, not when collected: its `finally` cancels the sequence, whose slot
    # would otherwise keep decoding into the next measurement.
    async with contextlib.aclosing(stream) as chunks:
        async for _ in chunks:
            times.append(time.perf_counter())
            if stop is not None and stop.is_set():
                break
    return times


async def stall_once(
    runtime: LLMRuntime,
    runner: SlotStepRunner | DecoderStepRunner,
    options: Options,
    prompt: str,
) -> dict[str, float]:
    """Running streams, then the long prompt: its TTFT and the streams' gaps around it."""
    stop = asyncio.Event()
    running = [
        asyncio.create_task(
            _timed_stream(runtime, chat_messages(), params(i, runtime.context_length // 2), stop)
        )
        for i in range(options.stall_streams)
    ]
    first_step = runner.steps
    while runner.active_slots < options.stall_streams or runner.steps < first_step + 16:
        await asyncio.sleep(0.05)  # every stream decoding, and a few gaps timed before
    sent = time.perf_counter()
    first = (await _timed_stream(runtime, prompt, params(-1, 1), None))[0]
    stop.set()
    before, during = [], []
    for times in await asyncio.gather(*running):
        for start, end in zip(times, times[1:], strict=False):
            if end <= sent:
                before.append(end - start)
            elif start < first:
                during.append(end - start)
    median_before = statistics.median(before)
    p99_during = float(np.percentile(during, 99)) if during else 0.0
    return {
        "ttft_s": round(first - sent, 3),
        "gap_median_before_ms": round(median_before * 1e3, 1),
        "gap_max_during_ms": round(max(during, default=0.0) * 1e3, 1),
        "max_during_over_median_before": round(max(during, default=0.0) / median_before, 2),
        "p99_during_over_median_before": round(p99_during / median_before, 2),
    }


async def stall(runtime: LLMRuntime, options: Options) -> dict[str, Any]:
    """Per chunk size (the runner's `prefill_chunk_tokens`) and pacer share (`chunk@share`,
    `@none`: unpaced), medians over runs, the variants alternating run by run."""
    runner = runtime.runner
    assert isinstance(runner, SlotStepRunner | DecoderStepRunner)
    runtime.prefix_cache.resize(0)  # the same long prompt every run: computed, never found cached
    prompt = long_prompt(options.model_dir, options.stall_prompt_tokens)
    variants = [(c, s) for c in options.stall_chunks for s in options.stall_shares]
    runs: dict[str, list[dict[str, float]]] = defaultdict(list)
    for run in range(options.runs):
        for chunk, share in variants if run % 2 == 0 else variants[::-1]:
            runner.prefill_chunk_tokens = chunk
            runner.pacer.step_share = share
            name = f"{chunk}@{'none' if share is None else share}"
            runs[name].append(await stall_once(runtime, runner, options, prompt))
    return {
        name: {key: statistics.median(r[key] for r in results) for key in results[0]}
        for name, results in runs.items()
    }


async def profile(options: Options) -> dict[str, Any]:
    runtime = open_runtime(options)
    report: dict[str, Any] = {
        "model_dir": str(options.model_dir),
        "threads": options.threads,
        "load_s": round(runtime.session.load_s, 2),
    }
    try:
        report["decode"] = await decode(runtime, options)
        if options.stall_chunks:
            report["stall"] = await stall(runtime, options)
    finally:
        runtime.close()
    if options.ort_ops:
        report["ort_ops"] = await ort_ops(options)
    return report


def parse(argv: Sequence[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=Path("models/glm"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--ort-ops", action="store_true")
    parser.add_argument("--stall-chunks", type=int, nargs="*", default=[])
    parser.add_argument(
        "--stall-shares",
        type=_share,
        nargs="+",
        default=[None],
        help="the pacer's step share per variant (none: chunks of the chunk size)",
    )
    parser.add_argument("--stall-streams", type=int, default=8)
    parser.add_argument("--stall-prompt-tokens", type=int, default=1500)
    args = parser.parse_args(argv)
    return Options(
        model_dir=args.model_dir,
        threads=args.threads,
        batches=tuple(args.batches),
        runs=args.runs,
        max_tokens=args.max_tokens,
        ort_ops=args.ort_ops,
        stall_chunks=tuple(args.stall_chunks),
        stall_shares=tuple(args.stall_shares),
        stall_streams=args.stall_streams,
        stall_prompt_tokens=args.stall_prompt_tokens,
    )


def _share(text: str) -> float | None:
    return None if text == "none" else float(text)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    report = asyncio.run(profile(parse(argv)))
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
