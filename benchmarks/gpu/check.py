"""`python -m benchmarks.gpu.check FP32_DIR FP16_DIR`: the GPU decode path in one JSON
document, for a machine with a GPU (run by benchmarks/gpu/check.sh): fp16 parity with the CPU
fp32 graph, tokens/s at 1/8/32 streams, and host<->device bytes per decode step with the KV
cache kept on the device vs copied back every step."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib.corpus import chat_messages
from benchmarks.lib.goals import goal
from deployments.contracts.manifest import ModelManifest
from deployments.contracts.sampling_params import SamplingParams
from deployments.replica.engine.decoder import DecoderGraph
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.session import Provider, SessionConfig, cuda_available, open_session

STREAMS = (1, 8, 32)
NEW_TOKENS = 64
PARITY_PROMPTS = (
    [{"role": "user", "content": "Tell me a short story about a train that runs late."}],
    [{"role": "user", "content": "hi"}],
    [{"role": "user", "content": "List three rivers of Europe, then explain why they matter."}],
)
FP16_MIN_COSINE = 0.99  # of last-position logits, fp16 GPU vs fp32 CPU


def _graph(model_dir: Path, config: SessionConfig) -> DecoderGraph:
    manifest = ModelManifest.load(model_dir)
    assert manifest.llm is not None
    return DecoderGraph(open_session(model_dir / manifest.graph, config), manifest.llm.kv_cache)


def parity(fp32_dir: Path, fp16_dir: Path, provider: Provider) -> dict[str, Any]:
    reference = LLMRuntime(fp32_dir, SessionConfig(provider="cpu"))
    device = _graph(fp16_dir, SessionConfig(provider=provider, io_binding=True))
    cosines, same_greedy = [], []
    for messages in PARITY_PROMPTS:
        prompt = reference.tokenizer.encode_chat(messages)
        expected = reference.graph.cached_logits(prompt, prompt[:8]).astype(np.float64)
        actual = device.cached_logits(prompt, prompt[:8]).astype(np.float64)
        cos = (
            (expected * actual).sum(1)
            / np.linalg.norm(expected, axis=1)
            / np.linalg.norm(actual, axis=1)
        )
        cosines.append(float(cos.min()))
        same_greedy.append(
            reference.graph.greedy_cached(prompt, 16) == device.greedy_cached(prompt, 16)
        )
    reference.close()
    return {
        "min_logit_cosine": goal(min(cosines), FP16_MIN_COSINE, "cosine of last-position logits"),
        "greedy_16_tokens_equal": same_greedy,
    }


async def _throughput(runtime: LLMRuntime, streams: int) -> dict[str, Any]:
    params = [
        SamplingParams(max_tokens=NEW_TOKENS, temperature=0.7, seed=seed) for seed in range(streams)
    ]
    await runtime.complete(chat_messages(), params[0])  # warm-up
    transfers = runtime.session.transfers
    up, down, steps = transfers.host_to_device, transfers.device_to_host, runtime.steps
    started = time.perf_counter()
    done = await asyncio.gather(*(runtime.complete(chat_messages(), p) for p in params))
    wall = time.perf_counter() - started
    tokens = sum(c.completion_tokens for c in done)
    steps = max(runtime.steps - steps, 1)
    return {
        "tokens_per_s": round(tokens / wall, 1),
        "engine_steps": steps,
        "host_to_device_bytes_per_step": round((transfers.host_to_device - up) / steps),
        "device_to_host_bytes_per_step": round((transfers.device_to_host - down) / steps),
        "step_profile": runtime.profile.per_step_ms(),
    }


def throughput(model_dir: Path, provider: Provider, io_binding: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for streams in STREAMS:
        runtime = LLMRuntime(
            model_dir, SessionConfig(provider=provider, io_binding=io_binding), max_batch_size=32
        )
        out[f"{streams}_streams"] = asyncio.run(_throughput(runtime, streams))
        runtime.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.check")
    parser.add_argument("fp32_dir", type=Path)
    parser.add_argument("fp16_dir", type=Path)
    parser.add_argument("--provider", default="cuda", choices=("cuda", "cpu"))
    args = parser.parse_args(argv)
    if args.provider == "cuda" and not cuda_available():
        print(
            "no CUDAExecutionProvider: install the gpu extra (make install ACCEL=gpu)",
            file=sys.stderr,
        )
        return 2
    report = {
        "provider": args.provider,
        "parity_fp16_vs_cpu_fp32": parity(args.fp32_dir, args.fp16_dir, args.provider),
        "kv_cache_on_device": throughput(args.fp16_dir, args.provider, io_binding=True),
        "kv_cache_copied_each_step": throughput(args.fp16_dir, args.provider, io_binding=False),
    }
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
