"""The cold-start suite's figures from its measurements: p50 per phase over the cycles, the
overhead and warm-pool ratios, the upscale and keep-warm summaries, and the goals they are held
to."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.lib.goals import GoalRecord, goal

COLD_START_TARGET_S = 0.75  # p50 zero -> first response, per default model
AFTER_COLD_TARGET = 1.5  # the request after a cold start / a warm one, at most
IDLE_PLATFORM_TARGET = 0.10  # the whole cluster at zero traffic, share of one core, at most
OVERHEAD_RATIO_TARGET = 1.2  # cold start / (empty replica start + in-process load), at most
EMPTY = "empty_replica"
# A cold start from request to response, in order (probe.split_phases says what each covers).
GOAL_PHASES = (
    "controller_decision_s",
    "replica_requested_s",
    "worker_scheduling_s",
    "process_start_s",
    "model_load_s",
    "warmup_s",
    "init_other_s",
    "ready_to_running_s",
    "running_to_response_s",
)
NO_POOL = "/no_warm_pool"  # suffix of a model's name for its cycles without the pool


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def summarize_cycles(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """p50 of every phase over the cycles, and the cycles themselves."""
    if not runs:
        return {"cycles": 0}
    keys = [k for k, v in runs[0].items() if not isinstance(v, bool) and k != "idle_warm_workers"]
    return {
        "cycles": len(runs),
        "p50": {key: _median([run[key] for run in runs]) for key in keys},
        "max_total_s": round(max(run["total_s"] for run in runs), 4),
        "reused_workers": sum(bool(run["reused_worker"]) for run in runs),
        "runs": list(runs),
    }


def overhead_ratios(
    cold_starts: Mapping[str, Mapping[str, Any]], in_process: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """Each model's p50 cold start / (p50 empty replica cold start + in-process load+warm-up)."""
    empty_s = cold_starts[EMPTY].get("p50", {}).get("total_s")
    ratios = {}
    for name, load in in_process.items():
        cold_s = cold_starts.get(name, {}).get("p50", {}).get("total_s")
        if cold_s is None or empty_s is None:
            continue
        baseline_s = empty_s + load["total_wall_s"]
        ratios[name] = {
            "cold_start_p50_s": cold_s,
            "empty_replica_p50_s": empty_s,
            "in_process_load_warmup_s": load["total_wall_s"],
            "ratio": round(cold_s / baseline_s, 3),
        }
    return ratios


def warm_pool_ratios(cold_starts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each model's p50 cold start with the pool / without it, cycles alternating in one run."""
    ratios = {}
    for name, summary in cold_starts.items():
        without = cold_starts.get(name + NO_POOL, {}).get("p50", {}).get("total_s")
        with_pool = summary.get("p50", {}).get("total_s")
        if name.endswith(NO_POOL) or without is None or with_pool is None:
            continue
        ratios[name] = {
            "with_pool_p50_s": with_pool,
            "without_pool_p50_s": without,
            "ratio": round(with_pool / without, 3),
            "reused_workers": f"{summary['reused_workers']}/{summary['cycles']}",
        }
    return ratios


def summarize_upscale(runs: Sequence[Mapping[str, Any]] | None) -> dict[str, Any] | None:
    if not runs:
        return None
    keys = [k for k in runs[0] if k.endswith("_s")]
    return {
        "repetitions": len(runs),
        "p50": {key: _median([run[key] for run in runs]) for key in keys},
        "runs": list(runs),
    }


def summarize_keep_warm(
    measured: Mapping[str, Any] | None, cold_starts: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The pre-warmed first request next to the same model's cold one (p50) from this run."""
    if not measured or "model" not in measured:
        return dict(measured) if measured else None
    cold_s = cold_starts.get(measured["model"], {}).get("p50", {}).get("total_s")
    return {
        **measured,
        "cold_first_response_p50_s": cold_s,
        "cold_over_prewarmed": round(cold_s / measured["first_response_s"], 1) if cold_s else None,
    }


def goals(
    cold_starts: Mapping[str, Mapping[str, Any]],
    ratios: Mapping[str, Mapping[str, Any]],
    after_cold: Mapping[str, Mapping[str, Any]] | None = None,
    idle_platform: Mapping[str, Any] | None = None,
) -> dict[str, GoalRecord]:
    result = {}
    for name, measured in (after_cold or {}).items():
        result[f"{name}_after_cold_vs_warm"] = goal(
            measured.get("ratio"),
            AFTER_COLD_TARGET,
            "x",
            at_most=True,
            missing="no cold start of it was measured",
            details=dict(measured),
            note="the request sent right after a cold start's response over a warm request "
            "once the warm pool is full again (p50 over cycles / median of 5)",
        )
    result["platform_idle_cpu_share"] = goal(
        idle_platform.get("cpu_share_of_one_core") if idle_platform else None,
        IDLE_PLATFORM_TARGET,
        "share of one core",
        at_most=True,
        missing="not measured (platform_idle_cpu_s is 0)",
        details=dict(idle_platform) if idle_platform else None,
        note="every process of the cluster (one node), the shipped application alone deployed, "
        "every model at zero, no traffic",
    )
    for name, summary in cold_starts.items():
        if name == EMPTY or name.endswith(NO_POOL):
            continue
        p50s = summary.get("p50", {})
        result[f"{name}_cold_start_p50"] = goal(
            p50s.get("total_s"),
            COLD_START_TARGET_S,
            "s",
            at_most=True,
            details={
                # Where the median went (each phase's own median: they need not add up to it).
                "phases_p50_s": {phase: p50s.get(phase) for phase in GOAL_PHASES},
                "cycles": summary.get("cycles", 0),
            },
        )
        result[f"{name}_cold_start_vs_empty_plus_load"] = goal(
            ratios.get(name, {}).get("ratio"), OVERHEAD_RATIO_TARGET, "x", at_most=True
        )
    return result
