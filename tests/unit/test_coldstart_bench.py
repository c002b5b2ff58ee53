"""The cold-start suite's verdicts and settings (benchmarks.coldstart), without a cluster."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from benchmarks.coldstart.cluster import CONTROL_LOOP_ENV_VAR, ServeVariant
from benchmarks.coldstart.suite import after_cold_ratios
from benchmarks.coldstart.summary import (
    AFTER_COLD_TARGET,
    COLD_START_TARGET_S,
    IDLE_PLATFORM_TARGET,
    goals,
    summarize_cycles,
)
from benchmarks.lib.processes import (
    cpu_used_between,
    cpu_used_by_title,
    process_title,
    title_from_argv,
)
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


def test_the_request_after_a_cold_start_is_judged_against_a_warm_one():
    cold_starts = {
        "embedding": summarize_cycles(
            [cycle(0.5, after_cold_s=0.05), cycle(0.6, after_cold_s=0.5)]
        ),
        "glm": summarize_cycles([cycle(0.5, after_cold_s=0.2), cycle(0.5, after_cold_s=0.3)]),
    }
    after = after_cold_ratios(cold_starts, {"embedding": 0.2, "glm": 0.1, "kimi": 0.1})
    assert after["embedding"] == {"after_cold_p50_s": 0.275, "warm_s": 0.2, "ratio": 1.375}
    assert after["kimi"]["ratio"] is None  # never cold-started: no figure
    verdicts = goals(cold_starts, {}, after, None)
    assert verdicts["embedding_after_cold_vs_warm"]["met"]
    glm = verdicts["glm_after_cold_vs_warm"]
    assert (glm["value"], glm["target"], glm["met"]) == (2.5, AFTER_COLD_TARGET, False)
    assert verdicts["kimi_after_cold_vs_warm"]["met"] is False  # a miss, not dropped


def test_the_idle_platform_goal_is_a_share_of_one_core_and_a_miss_when_not_measured():
    verdict = goals({}, {}, {}, {"cpu_share_of_one_core": 0.08, "processes": 20, "seconds": 20})
    idle = verdict["platform_idle_cpu_share"]
    assert (idle["value"], idle["target"], idle["met"]) == (0.08, IDLE_PLATFORM_TARGET, True)
    busy = goals({}, {}, {}, {"cpu_share_of_one_core": 0.3})["platform_idle_cpu_share"]
    assert busy["met"] is False
    never = goals({}, {}, {}, None)["platform_idle_cpu_share"]
    assert never["met"] is False and "not measured" in never["missing"]


def test_cpu_between_readings_counts_a_new_process_whole_and_a_gone_one_not_at_all():
    before = {1: 10.0, 2: 5.0, 3: 7.0}  # 3 exits in between
    after = {1: 10.5, 2: 5.25, 4: 0.5}  # 4 starts in between
    assert cpu_used_between(before, after) == pytest.approx(1.25)


def test_idle_cpu_is_summed_per_process_title_most_first():
    before = {1: 1.0, 2: 2.0, 3: 0.5}
    after = {1: 1.5, 2: 2.1, 3: 1.0, 4: 0.25}
    titles = {1: "ray::ServeReplica:edge:router", 2: "raylet", 3: "ray::ServeReplica:edge:router"}
    used = cpu_used_by_title(before, after, titles)
    assert list(used) == ["ray::ServeReplica:edge:router", "(unknown)", "raylet"]
    assert used["ray::ServeReplica:edge:router"] == pytest.approx(1.0)
    assert used["raylet"] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("argv", "title"),
    [
        (["ray::ServeReplica:edge:router"], "ray::ServeReplica:edge:router"),
        (["ray::ServeController.get_serve_instance_details"], "ray::ServeController"),
        (["ray-dashboard-MetricsHead-0 (/venv/bin/python -B -c x)"], "ray-dashboard-MetricsHead-0"),
        (["/ray/core/src/ray/gcs/gcs_server", "--log_dir=/tmp"], "gcs_server"),
        (["/venv/bin/python3.11", "-u", "/ray/_private/log_monitor.py", "--a"], "log_monitor.py"),
        (["/venv/bin/python", "-m", "benchmarks.run", "--suite", "chat"], "benchmarks.run"),
        (["/venv/bin/python", "-B", "-c", "import x"], "python -c"),
        ([], "(unnamed)"),
    ],
)
def test_a_process_is_named_by_its_title_or_program(argv: list[str], title: str):
    assert title_from_argv(argv) == title


def test_a_process_gone_is_named_so():
    assert process_title(2**22 + 1) == "(exited)"  # above Linux's pid_max


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
