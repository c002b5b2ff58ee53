"""The pure parts of the suites that otherwise need a cluster (regions, security, prewarm), run
without Ray: what they measure in process, how the suites shape their deployments, and their
goals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from benchmarks.lease_outage import LeaseStore, budget_lease_outage, lease_goals
from benchmarks.prewarm import (
    PrewarmBenchConfig,
    compare_arms,
    measured_day,
    prewarm_goals,
    prewarm_serve_config,
)
from benchmarks.regions import TIGHT, goals, regions_serve_config
from benchmarks.regions import decision_cost_us as region_plan_cost_us
from benchmarks.security import admission_cost_us
from deployments.config import parse_app_config
from edgectl.local_services import ServiceUnavailable, postgres_bin_dir


def test_the_region_plan_and_admission_costs_are_measured_in_process() -> None:
    assert region_plan_cost_us(repeat=5) > 0
    admission = admission_cost_us(repeat=5)
    assert admission["features_on_us"] > 0 and admission["auth_only_us"] > 0
    assert admission["added_us"] == admission["features_on_us"] - admission["features_off_us"]


def _check_outage(store: LeaseStore) -> dict[str, Any]:
    """Two keys on two routers, the database away briefly: the bound goals are met whatever the
    timing (the reconcile time is reported, not judged here)."""
    outage = budget_lease_outage(keys=2, routers=2, outage_s=0.05, store=store)
    assert outage["store"] == store
    assert set(outage["per_key"]) == {"key-0", "key-1"}
    for key in outage["per_key"].values():
        assert key["leases_out"] > 0 and key["reserved_after_stop"] == 0
        assert key["spent"] <= outage["budget_per_key"]
    goals = lease_goals(outage, store)
    reconcile = next(name for name in goals if name.endswith("_reconcile_s"))
    assert all(goals[name]["met"] for name in goals if name != reconcile)
    assert goals[reconcile]["value"] is not None
    return goals


def test_the_budget_lease_outage_with_sqlite_locked_is_measured_with_its_goals() -> None:
    goals = _check_outage("sqlite")
    # Named before PostgreSQL was measured; recorded reports compare by these names.
    assert set(goals) == {
        "budget_lease_refused_within_leases",
        "budget_lease_admitted_beyond_leases_out",
        "budget_lease_overspend_beyond_leases_out",
        "budget_lease_reconcile_s",
    }


def test_the_budget_lease_outage_with_postgres_killed_is_measured_with_its_goals(
    unavailable: Callable[[str], NoReturn],
) -> None:
    """The suite's own server SIGKILLed and restarted; no binaries: a skip here (named), a
    failure under CI=true."""
    try:
        postgres_bin_dir()
    except ServiceUnavailable as absent:
        unavailable(str(absent))
    goals = _check_outage("postgres")
    assert all(name.startswith("budget_lease_postgres_") for name in goals) and len(goals) == 4


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


def test_the_prewarm_deployment_is_one_model_at_zero_in_every_region_on_the_compressed_day():
    bench = PrewarmBenchConfig(models_dir=Path("models"))
    config = prewarm_serve_config(Path("models"), 8999, bench, bench.prewarm(True))
    app = config["applications"][0]
    parsed = parse_app_config(app["args"])  # what `serve deploy` would validate
    assert list(parsed.models) == ["moderation"] and parsed.edge.prewarm.enabled
    assert parsed.edge.prewarm.period_s == bench.day_s
    pools = [d for d in app["deployments"] if d["name"] != "router"]
    assert sorted(d["name"] for d in pools) == ["moderation-ap", "moderation-eu", "moderation-us"]
    for pool in pools:
        scaling = pool["autoscaling_config"]
        assert scaling["initial_replicas"] == 0 and scaling["max_replicas"] == 1
        assert scaling["downscale_to_zero_delay_s"] == bench.to_zero_s


def _summary(cold: int, replica_s: float, running_s: float) -> dict:
    return {
        "by_phase": {"day 2": {"requests": 10, "errors": {}, "cold_starts": cold}},
        "route_reasons": {"nearest": 10},
        "replicas": {
            "moderation-eu": {
                "replica_s_by_phase": {"day 1": 99.0, "day 2": replica_s},
                "running_replica_s_by_phase": {"day 1": 99.0, "day 2": running_s},
            }
        },
        "replica_sampling": {"samples": 5},
    }


def test_prewarm_figures_come_from_the_second_day_and_judge_both_halves_of_the_goal():
    zero, ahead = measured_day(_summary(20, 100.0, 80.0)), measured_day(_summary(2, 120.0, 110.0))
    assert (zero["cold_starts"], zero["replica_s"], zero["running_replica_s"]) == (20, 100.0, 80.0)
    compared = compare_arms(zero, ahead, warm_s=300.0)
    assert compared["hidden_vs_scale_to_zero"] == 0.9
    assert compared["extra_replica_s_vs_scale_to_zero"] == 0.2
    assert compared["extra_running_replica_s_vs_scale_to_zero"] == 0.375
    verdicts = prewarm_goals(compared, "not run")
    assert verdicts["prewarm_live_hidden_share"]["met"]
    assert verdicts["prewarm_live_extra_replica_s"]["met"]
    missed = prewarm_goals({}, "cluster: RuntimeError")
    assert not missed["prewarm_live_hidden_share"]["met"]
    assert missed["prewarm_live_extra_replica_s"]["missing"] == "cluster: RuntimeError"
