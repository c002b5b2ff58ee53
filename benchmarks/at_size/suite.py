"""The at-size suite (`--suite at_size`): the GLM-4 and Kimi-K2 stand-ins at size
(`deployments.export large`, built when missing) served by serve_config.yaml's application on a
private Ray + Serve, against vLLM's OpenAI server (`--vllm-python`; off with `--no-peers`) on the
very checkpoints they were exported from:

- per model and vLLM dtype row (fp32 against fp32, then each side's best), `runs` runs with the
  sides alternating: TTFT p50 and tokens/s of single streams, tokens/s of `streams` at once;
- the compute roof: FLOPs per token times our tokens/s at `streams`, over this machine's fp32
  GEMM FLOP/s at the model's own step shape (benchmarks.at_size.roof);
- int8's greedy agreement with the fp32 graph, offline (benchmarks.at_size.agreement);
- a second replica's memory on one node, offline (benchmarks.at_size.replica_memory);
- the decode stall: running streams' chunk gaps while a long prompt is prefilled;
- each model's cold start from zero through `serve run` (benchmarks.at_size.cold_start).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from benchmarks.at_size import models as at_size_models
from benchmarks.at_size.agreement import greedy_agreement
from benchmarks.at_size.config import INT8, AtSizeBenchConfig, add_arguments, config_from_args
from benchmarks.at_size.load import chat_body, decode_stall, long_prompt, measure_side
from benchmarks.at_size.replica_memory import replica_memory
from benchmarks.at_size.roof import flops_per_token, gemm_flops_per_s, weight_gemms
from benchmarks.at_size.verdicts import VLLM, goals
from benchmarks.chat.vllm_peer import VllmServer, serve_checkpoint
from benchmarks.lib.corpus import chat_messages
from benchmarks.lib.edge_app import BYPASS_CACHE, our_url
from benchmarks.lib.http_load import BadResponseError, Endpoint, async_client, ready, rotated
from benchmarks.lib.served import served

log = logging.getLogger(__name__)

__all__ = ["NEEDS_RAY", "add_arguments", "run", "run_at_size"]

NEEDS_RAY = True

Clock = Callable[[], float]
CHAT_PATH = "/v1/chat/completions"


def run(args: argparse.Namespace) -> dict[str, Any]:
    return run_at_size(config_from_args(args))


def run_at_size(config: AtSizeBenchConfig, clock: Clock = time.perf_counter) -> dict[str, Any]:
    result: dict[str, Any] = {"config": config.model_dump(mode="json")}
    result["models"] = at_size_models.ensure_built(config)
    # The offline parts first, alone on the machine: no cluster, no peer.
    result["roof"] = {model: roof(config, model) for model in config.models}
    result["int8_agreement"] = {
        model: greedy_agreement(
            config.model_dir(model),
            config.model_dir(INT8[model]),
            config.agreement_prompts,
            config.agreement_tokens,
            config.threads,
        )
        for model in config.models
        if model in INT8
    }
    result["replica_memory"] = {model: _replica_memory(config, model) for model in config.models}
    with served(config, [at_size_models.at_size_application(config)]) as (base_url, _):
        ours = Endpoint(f"{our_url(config, base_url)}{CHAT_PATH}", BYPASS_CACHE)
        result["decode_stall"] = {
            model: asyncio.run(_stall_runs(config, ours, model, clock)) for model in config.models
        }
        result["sides"] = {model: _compare(config, model, ours, clock) for model in config.models}
    # Last, on a `serve run` of its own: every model at size from zero, cycle after cycle.
    # Imported here: `python -m benchmarks.at_size.cold_start` runs it alone, and a module the
    # package's import of this suite had loaded already would run twice (runpy warns).
    from benchmarks.at_size.cold_start import cold_starts

    result["cold_start"] = {model: cold_starts(config, model) for model in config.models}
    result["goals"] = goals(result, config)
    return result


def _replica_memory(config: AtSizeBenchConfig, model: str) -> dict[str, Any]:
    try:
        return replica_memory(config.model_dir(model), config.threads)
    except (
        RuntimeError,
        OSError,
        ValueError,
    ) as exc:  # a miss that says why; the other parts go on
        log.warning("%s replica memory: %s", model, exc)
        return {"error": f"{type(exc).__name__}: {exc}"}


def roof(config: AtSizeBenchConfig, model: str) -> dict[str, Any]:
    """FLOPs per token at the timed requests' mean context, the machine's GEMM rate at the
    model's step shape (`streams` rows)."""
    model_config = json.loads((config.model_dir(model) / "config.json").read_text())
    context = 32 + config.max_tokens // 2  # the chat prompt's ~30 tokens, half the answer
    return {
        "flops_per_token": flops_per_token(model_config, context),
        "context": context,
        "gemm": gemm_flops_per_s(weight_gemms(model_config), config.streams, config.gemm_repeats),
    }


async def _stall_runs(
    config: AtSizeBenchConfig, ours: Endpoint, model: str, clock: Clock
) -> list[dict[str, Any]]:
    prompt = long_prompt(config.model_dir(model), config.prefill_tokens)
    async with async_client(config.running_streams + 1) as client:
        await ready(client, ours, chat_body(model, 0, 2))
        runs: list[dict[str, Any]] = []
        for run_index in range(config.runs):
            await asyncio.sleep(config.settle_s)
            seed = 10_000 * (run_index + 1)
            try:
                runs.append(await decode_stall(config, client, ours, model, prompt, seed, clock))
            except BadResponseError as exc:  # a miss that says why; the other parts go on
                log.warning("%s decode stall, run %d: %s", model, run_index, exc)
                return [*runs, {"error": str(exc)}]
            log.info(
                "%s decode stall, run %d: %s",
                model,
                run_index,
                runs[-1]["p99_during_over_median_before"],
            )
    return runs


def _compare(config: AtSizeBenchConfig, model: str, ours: Endpoint, clock: Clock) -> dict[str, Any]:
    """`model`'s rows: against vLLM per dtype row, or ours alone without a peer."""
    if not config.peers or config.vllm_python is None:
        sides = [model, *([INT8[model]] if model in INT8 else [])]
        targets = {name: (ours, name) for name in sides}
        return {"ours": asyncio.run(_alternate(config, targets, clock))}
    python = config.vllm_python
    rows: dict[str, Any] = {"vllm_build": at_size_models.vllm_build(python)}
    rows["cpu_flags"] = at_size_models.cpu_flags()
    checkpoint = at_size_models.checkpoint_dir(config, model)
    for row in at_size_models.vllm_rows(model):
        args, env = at_size_models.vllm_args(row), at_size_models.vllm_env(config)
        settings = {"checkpoint": str(checkpoint), "args": args, "env": env}
        with (
            tempfile.TemporaryDirectory(prefix="vllm-at-size-") as scratch,
            serve_checkpoint(python, checkpoint, model, args, Path(scratch), env) as vllm,
        ):
            measured = _versus(config, model, row.ours, ours, vllm, clock)
            rows[row.name] = {"vllm": settings, **measured}
    return rows


def _versus(
    config: AtSizeBenchConfig,
    model: str,
    exports: tuple[str, ...],
    ours: Endpoint,
    vllm: VllmServer,
    clock: Clock,
) -> dict[str, Any]:
    try:
        vllm.wait_ready(config.vllm_start_timeout_s)
    except (RuntimeError, TimeoutError) as exc:
        log.warning("vLLM peer: %s", exc)
        return {"error": str(exc)}
    targets = {name: (ours, name) for name in exports}
    targets[VLLM] = (Endpoint(f"{vllm.base_url}{CHAT_PATH}"), model)
    try:
        return asyncio.run(_alternate(config, targets, clock))
    except (OSError, RuntimeError) as exc:  # e.g. vLLM's engine died on a request
        log.warning("%s against vLLM: %s", model, exc)
        return {"error": f"{type(exc).__name__}: {exc}", "vllm_log_tail": vllm.log_tail()}


async def _alternate(
    config: AtSizeBenchConfig, targets: Mapping[str, tuple[Endpoint, str]], clock: Clock
) -> dict[str, Any]:
    """`runs` runs, each side once per run, the order rotating; every side warmed alike first."""
    async with async_client(config.streams) as client:
        for endpoint, model in targets.values():
            await ready(client, endpoint, chat_body(model, 0, 2))
            # Warm as a run does: a single stream and a burst (every batch size's first call).
            await measure_side(config, client, endpoint, model, -1000, clock)
        runs: list[dict[str, Any]] = []
        for run_index in range(config.runs):
            figures = {}
            for name in rotated(list(targets), run_index):
                endpoint, model = targets[name]
                seed = 1000 * (run_index + 1)
                figures[name] = await measure_side(config, client, endpoint, model, seed, clock)
                log.info("run %d %s: %s", run_index, name, figures[name])
            runs.append(figures)
    return {"runs": runs, "messages": chat_messages()}
