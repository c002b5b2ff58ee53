"""The pure parts of the suites that otherwise need a cluster (regions, security), run without
Ray: what they measure in process, how the regions suite shapes its deployment, and its goals."""

from __future__ import annotations

from pathlib import Path

from benchmarks.regions import TIGHT, goals, regions_serve_config
from benchmarks.regions import decision_cost_us as region_plan_cost_us
from benchmarks.security import admission_cost_us


def test_the_region_plan_and_admission_costs_are_measured_in_process() -> None:
    assert region_plan_cost_us(repeat=5) > 0
    admission = admission_cost_us(repeat=5)
    assert admission["features_on_us"] > 0 and admission["auth_only_us"] > 0
    assert admission["added_us"] == admission["features_on_us"] - admission["features_off_us"]


def test_the_regions_deployment_has_a_cold_copy_and_tight_moderation_pools() -> None:
    config = regions_serve_config(Path("models"), http_port=8999)
    assert config["http_options"]["port"] == 8999
    deployments = {d["name"]: d for d in config["applications"][0]["deployments"]}
    for region in ("eu", "us", "ap"):
        assert (
            deployments[f"embedding_cold-{region}"]["autoscaling_config"]["initial_replicas"] == 0
        )
        assert (
            deployments[f"moderation-{region}"]["max_ongoing_requests"]
            == TIGHT["max_ongoing_requests"]
        )
    assert "router" in deployments


def test_regions_goals_judge_each_direction_and_miss_what_was_not_measured() -> None:
    verdicts = goals(
        {
            "all_warm": {"nearest_share": 1.0, "added_rtt_p50_ms": 3.0},
            "cold_start_avoidance": {"detour_vs_wait_p50": 0.1},
            "region_outage": {"failed": 0},
        }
    )
    met = {name: verdict["met"] for name, verdict in verdicts.items()}
    assert met == {
        "all_warm_nearest_share": True,
        "all_warm_added_rtt_p50_ms": False,  # 3 ms over the nearest region's, at most 1
        "cold_detour_vs_wait_p50": True,
        "outage_failed_requests": True,
        "overload_regions_ejected": False,  # the overload phase did not run
        "overload_sheds_with_retry_after": False,
    }
    assert "miss" in verdicts["overload_regions_ejected"]["missing"]
