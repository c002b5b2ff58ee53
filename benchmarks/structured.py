"""Structured outputs: what grammar-constrained decoding costs.

- mask build: a 20-field JSON schema compiled into a request's constraint, first mask included
  (goal < 5 ms); outlines-core's index for the same schema, when installed, for comparison.
- decoding: ms per generated token at batch 8 (one request, n=8) with and without a JSON-schema
  constraint, interleaved runs on the same model (goal: constrained at most 15 % slower).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import Field

from benchmarks.lib.config import BenchConfig, Provider
from benchmarks.lib.goals import goal
from deployments.contracts.sampling_params import GenerationOptions, GrammarSpec, SamplingParams
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.session import SessionConfig

NEEDS_RAY = False

MASK_BUILD_GOAL_MS = 5.0
OVERHEAD_GOAL = 0.15
BATCH = 8
FIELD_TYPES = ({"type": "string"}, {"type": "integer"}, {"type": "boolean"}, {"type": "number"})
# One long free string: every step is constrained, none is cut short by the document closing.
LONG_TEXT = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}


def twenty_fields() -> dict[str, Any]:
    names = [f"field_{i}" for i in range(20)]
    return {
        "type": "object",
        "properties": {n: FIELD_TYPES[i % len(FIELD_TYPES)] for i, n in enumerate(names)},
        "required": names,
        "additionalProperties": False,
    }


def mask_build_ms(runtime: LLMRuntime, repeat: int) -> dict[str, float]:
    """Grammar build with its first token mask; separately, the one-off estimate of the
    shortest completion (walked token by token) that a request also pays once."""
    schema = twenty_fields()
    compiler = runtime.grammar_compiler
    build, closing = [], []
    for _ in range(repeat):
        started = time.perf_counter()
        constraint = compiler.json_schema(schema)
        constraint.first_mask()
        built = time.perf_counter()
        constraint.closing_cost()
        build.append((built - started) * 1000)
        closing.append((time.perf_counter() - built) * 1000)
    return {
        "median_ms": statistics.median(build),
        "max_ms": max(build),
        "closing_estimate_median_ms": statistics.median(closing),
    }


def outlines_core_index_ms(model_dir: Path) -> float | None:
    try:
        from outlines_core import Index, Vocabulary
        from outlines_core.json_schema import build_regex_from_schema
        from tokenizers import Tokenizer
    except ImportError:
        return None
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    specials = set(tokenizer.get_added_tokens_decoder())
    vocab: dict[str, list[int]] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id not in specials:
            vocab.setdefault(token, []).append(token_id)
    started = time.perf_counter()
    Index(build_regex_from_schema(json.dumps(twenty_fields())), Vocabulary(0, vocab))
    return (time.perf_counter() - started) * 1000


def decode_ms_per_token(runtime: LLMRuntime, grammar: GrammarSpec | None, tokens: int) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=1.0, seed=1)
    started = time.perf_counter()
    choices = asyncio.run(
        runtime.complete_choices(
            [{"role": "user", "content": "Describe the sea."}],
            params,
            GenerationOptions(n=BATCH, grammar=grammar),
        )
    )
    generated = sum(c.completion_tokens for c in choices)
    return (time.perf_counter() - started) * 1000 / max(generated, 1)


class StructuredBenchConfig(BenchConfig):
    QUICK = {"mask_repetitions": 20, "rounds": 2, "new_tokens": 32}

    provider: Provider = "cpu"
    threads: int = Field(default=2, ge=1)
    model: str = "glm"
    mask_repetitions: int = Field(default=200, ge=1)
    rounds: int = Field(default=6, ge=1, description="interleaved decode runs per side")
    new_tokens: int = Field(default=96, ge=1)


def run(args: argparse.Namespace) -> dict[str, Any]:
    config = StructuredBenchConfig.from_args(args, provider=args.provider, threads=args.threads)
    return run_structured_suite(config)


def run_structured_suite(config: StructuredBenchConfig) -> dict[str, Any]:
    model_dir = config.models_dir / config.model
    runtime = LLMRuntime(
        model_dir, SessionConfig(provider=config.provider, intra_op_threads=config.threads)
    )
    runtime.max_batch_size = BATCH
    try:
        build = mask_build_ms(runtime, repeat=config.mask_repetitions)
        plain, constrained = [], []
        spec = GrammarSpec("json_schema", LONG_TEXT)
        decode_ms_per_token(runtime, None, 8)  # warm both paths once
        decode_ms_per_token(runtime, spec, 8)
        for _ in range(config.rounds):
            plain.append(decode_ms_per_token(runtime, None, config.new_tokens))
            constrained.append(decode_ms_per_token(runtime, spec, config.new_tokens))
    finally:
        runtime.close()
    plain_ms, constrained_ms = statistics.median(plain), statistics.median(constrained)
    overhead = constrained_ms / plain_ms - 1.0
    result: dict[str, Any] = {
        "config": config.model_dump(mode="json"),
        "library": "llguidance",
        "mask_build_20_fields": build,
        "outlines_core_index_20_fields_ms": outlines_core_index_ms(model_dir),
        "decode_batch": BATCH,
        "decode_ms_per_token": {"unconstrained": plain_ms, "json_schema": constrained_ms},
        "goals": {
            "mask_build_ms": goal(build["median_ms"], MASK_BUILD_GOAL_MS, "ms", at_most=True),
            "constrained_overhead": goal(overhead, OVERHEAD_GOAL, "ratio", at_most=True),
        },
    }
    print(f"structured: {result}", file=sys.stderr)
    return result
