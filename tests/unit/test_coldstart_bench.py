"""The cold-start suite's verdicts and settings (benchmarks.coldstart), without a cluster."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from benchmarks.coldstart.cluster import CONTROL_LOOP_ENV_VAR, ServeVariant
from benchmarks.coldstart.suite import COLD_START_TARGET_S, goals, summarize_cycles
from deployments.config import PROJECT_ROOT


def cycle(total_s: float, **phases: Any) -> dict[str, Any]:
    return {
        "total_s": total_s,
        "controller_decision_s": 0.05,
        "model_load_s": 0.02,
        "reused_worker": True,
        "pool_refilled_s": None,
        "idle_warm_workers": 2,
        **phases,
    }


def test_the_goal_is_the_median_cold_start_with_its_phases():
    runs = [cycle(0.5), cycle(0.7, controller_decision_s=0.4), cycle(3.0)]
    verdict = goals({"embedding": summarize_cycles(runs)}, {})["embedding_cold_start_p50"]
    assert verdict["value"] == 0.7 and verdict["target"] == COLD_START_TARGET_S
    details = verdict["details"]
    assert verdict["met"] and verdict["at_most"] and details["cycles"] == 3
    assert details["phases_p50_s"]["controller_decision_s"] == 0.05
    assert details["phases_p50_s"]["model_load_s"] == 0.02
    assert details["phases_p50_s"]["ready_to_running_s"] is None  # not measured: no figure


def test_a_slow_median_or_a_model_never_measured_is_a_miss():
    cold_starts = {"glm": summarize_cycles([cycle(0.9), cycle(0.8)]), "kimi": summarize_cycles([])}
    verdicts = goals(cold_starts, {})
    assert verdicts["glm_cold_start_p50"]["met"] is False
    never = verdicts["kimi_cold_start_p50"]
    assert (never["value"], never["met"], never["details"]["cycles"]) == (None, False, 0)
    # The vs-empty ratio could not be computed for either: both missed, not dropped.
    assert verdicts["glm_cold_start_vs_empty_plus_load"]["met"] is False


def test_a_phase_missing_in_some_cycles_takes_the_median_of_the_rest():
    summary = summarize_cycles([cycle(0.5, pool_refilled_s=2.0), cycle(0.6), cycle(0.7)])
    assert summary["p50"]["pool_refilled_s"] == 2.0


@pytest.fixture(scope="module")
def shipped() -> dict[str, Any]:
    return yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())


def test_the_bench_starts_the_controller_as_serve_config_yaml_does(shipped: dict[str, Any]):
    variant = ServeVariant()
    assert variant.controller_options(shipped) == shipped["controller_options"]
    interval_s = float(
        shipped["controller_options"]["runtime_env"]["env_vars"][CONTROL_LOOP_ENV_VAR]
    )
    assert variant.control_loop_interval_s(shipped) == interval_s < 0.1  # below Serve's default


def test_a_control_loop_variant_replaces_the_shipped_interval_only(shipped: dict[str, Any]):
    variant = ServeVariant(control_loop_s=0.1)
    env_vars = shipped["controller_options"]["runtime_env"]["env_vars"]
    assert variant.controller_options(shipped) == {
        "runtime_env": {"env_vars": {**env_vars, CONTROL_LOOP_ENV_VAR: "0.1"}}
    }
    assert variant.control_loop_interval_s(shipped) == 0.1
    assert ServeVariant().control_loop_interval_s({}) == 0.1  # no controller_options: Serve's
