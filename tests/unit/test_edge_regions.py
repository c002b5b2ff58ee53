"""Regions without Ray: colo -> region mapping, the routing decision from a snapshot of real
state (warmth, back-pressure, health), and the shared board that makes those snapshots."""

from __future__ import annotations

import pytest

from edge_sim.clock import ManualClock
from edge_sim.config import EdgeConfig
from edge_sim.region_board import Outcome, RegionBoard
from edge_sim.regions import (
    SINGLE_REGION,
    PoolView,
    RegionPolicy,
    deployment_name,
    plan_regions,
)
from edge_sim.validation import EdgeConfigError

REGIONS = {
    "eu": {"lat": 50.11, "lon": 8.68},
    "us": {"lat": 39.04, "lon": -77.49},
    "ap": {"lat": 1.36, "lon": 103.99},
}
# From Tokyo: its own region ap first, then the others by RTT (ms), as the region map gives them.
FROM_TOKYO = [("ap", 80.0), ("eu", 145.0), ("us", 165.0)]
WARM = PoolView(running=1)
COLD = PoolView(running=0)
COLD_START_MS = 3000.0


def plan(pools: dict[str, PoolView], **kwargs: object):
    options = {"cold_start_ms": COLD_START_MS, **kwargs}
    return plan_regions(FROM_TOKYO, pools, **options)  # type: ignore[arg-type]


def regions_of(result) -> list[str]:
    return [c.region for c in result.candidates]


# ---- the decision ---------------------------------------------------------------------------


def test_all_warm_goes_to_the_nearest_region_without_waking_anything() -> None:
    result = plan({"ap": WARM, "us": WARM, "eu": WARM})
    assert regions_of(result) == ["ap", "eu", "us"]
    assert result.candidates[0].reason == "nearest"
    assert result.wake is None


def test_cold_nearest_with_a_warm_neighbour_in_budget_detours_and_wakes_the_nearest() -> None:
    result = plan({"ap": COLD, "us": COLD, "eu": WARM})
    assert regions_of(result)[0] == "eu"
    assert result.candidates[0].reason == "warm"
    assert result.wake == "ap"
    assert "ap" in regions_of(result)  # still a failover target


def test_warm_neighbour_beyond_the_cold_start_budget_is_not_worth_it() -> None:
    result = plan({"ap": COLD, "us": COLD, "eu": WARM}, cold_start_ms=50.0)
    assert regions_of(result)[0] == "ap"
    assert result.candidates[0].reason == "nearest"
    assert result.wake is None  # the request itself makes Serve scale ap up


def test_fixed_extra_rtt_budget_overrides_the_cold_start() -> None:
    result = plan({"ap": COLD, "eu": WARM}, max_extra_rtt_ms=0.0)
    assert regions_of(result)[0] == "ap"


def test_all_cold_goes_to_the_nearest() -> None:
    result = plan({})
    assert regions_of(result)[0] == "ap"
    assert result.candidates[0].reason == "nearest"
    assert result.wake is None


def test_saturated_nearest_spills_to_the_next_region_and_stays_last() -> None:
    full = PoolView(running=2, saturated=True)
    result = plan({"ap": full, "us": WARM, "eu": WARM})
    assert regions_of(result) == ["eu", "us", "ap"]
    assert result.candidates[0].reason == "spillover"


def test_every_region_saturated_keeps_rtt_order() -> None:
    full = PoolView(running=1, saturated=True)
    result = plan({"ap": full, "us": full, "eu": full})
    assert regions_of(result) == ["ap", "eu", "us"]
    assert result.candidates[0].reason == "nearest"


def test_ejected_region_is_skipped_and_the_answer_says_failover() -> None:
    result = plan({"ap": PoolView(running=1, ejected=True), "us": WARM, "eu": WARM})
    assert regions_of(result) == ["eu", "us"]
    assert result.candidates[0].reason == "failover"


def test_a_snapshot_with_every_region_ejected_still_routes() -> None:
    gone = PoolView(running=1, ejected=True)
    result = plan({"ap": gone, "us": gone, "eu": gone})
    assert regions_of(result) == ["ap", "eu", "us"]


def test_warm_detour_skips_saturated_and_ejected_regions() -> None:
    result = plan(
        {"ap": COLD, "eu": PoolView(running=1, saturated=True), "us": PoolView(1, ejected=True)}
    )
    assert regions_of(result)[0] == "ap"
    assert result.wake is None


def test_max_candidates_cuts_the_failover_list() -> None:
    assert len(plan({}, max_candidates=2).candidates) == 2


# ---- the board: real outcomes in, snapshots out ----------------------------------------------


def board(clock: ManualClock, **policy: object) -> RegionBoard:
    return RegionBoard(
        ["glm", "embedding"],
        ["eu", "us", "ap"],
        RegionPolicy.model_validate(policy),
        default_cold_start_ms=COLD_START_MS,
        clock=clock,
    )


def test_back_pressure_marks_full_for_a_moment_and_ejects_nothing() -> None:
    clock = ManualClock()
    b = board(clock, saturation_hold_s=1.0)
    b.report([Outcome("glm", "eu", "saturated")] * 500)
    assert b.pool("glm", "eu") == PoolView(running=0, ejected=False, saturated=True)
    assert b.pool("embedding", "eu").saturated is False  # per model
    clock.advance(0.5)
    assert b.pool("glm", "eu").saturated
    clock.advance(0.5)  # saturation_hold_s over, to the tick
    assert b.pool("glm", "eu").saturated is False
    assert all(not p.ejected for m in b.snapshot().pools.values() for p in m.values())


def test_real_failures_eject_one_region_for_one_model_only() -> None:
    clock = ManualClock()
    b = board(clock)
    b.report([Outcome("glm", "ap", "failed")] * 3)
    assert b.pool("glm", "ap").ejected
    assert not b.pool("embedding", "ap").ejected


def test_ejection_cap_leaves_the_other_regions_in() -> None:
    clock = ManualClock()
    b = board(clock)  # default: 10% of three regions, at least one may be out
    for region in ("ap", "us", "eu"):
        b.report([Outcome("glm", region, "failed")] * 10)
    ejected = [r for r in ("eu", "us", "ap") if b.pool("glm", r).ejected]
    assert ejected == ["ap"]


def test_the_last_healthy_region_is_never_ejected() -> None:
    clock = ManualClock()
    b = RegionBoard(
        ["glm"],
        ["eu", "ap"],
        RegionPolicy.model_validate({"health": {"max_ejection_percent": 100}}),
        COLD_START_MS,
        clock,
    )
    b.report([Outcome("glm", "ap", "failed")] * 10)
    b.report([Outcome("glm", "eu", "failed")] * 30)
    assert b.pool("glm", "ap").ejected
    assert not b.pool("glm", "eu").ejected


def test_ejected_region_comes_back_after_a_good_probe() -> None:
    clock = ManualClock()
    b = board(clock)
    b.report([Outcome("glm", "ap", "failed")] * 3)
    clock.advance(10.0)  # base ejection time: half-open, routable again
    assert not b.pool("glm", "ap").ejected
    b.report([Outcome("glm", "ap", "ok")])
    assert b.describe()[2]["models"]["glm"]["health"]["state"] == "healthy"


def test_a_region_back_from_ejection_is_ejected_again_by_one_failure_for_longer() -> None:
    clock = ManualClock()
    b = board(clock)
    b.report([Outcome("glm", "ap", "failed")] * 3)
    clock.advance(10.0)
    assert not b.pool("glm", "ap").ejected  # every router may send it requests again
    b.report([Outcome("glm", "ap", "failed")])
    assert b.pool("glm", "ap").ejected
    clock.advance(10.0)
    assert b.pool("glm", "ap").ejected  # the second ejection lasts twice the base time
    clock.advance(10.0)
    assert not b.pool("glm", "ap").ejected


def test_warmth_is_what_serve_reports_and_cold_starts_are_learned() -> None:
    b = board(ManualClock())
    b.set_replicas({("glm", "eu"): 1}, {("glm", "eu"): 1, ("glm", "ap"): 1})
    snapshot = b.snapshot()
    assert snapshot.pool("glm", "eu").warm and not snapshot.pool("glm", "ap").warm
    # none measured: the board's default, and the routers' snapshot says it is only that
    assert b.cold_start_ms("glm") == COLD_START_MS and "glm" not in snapshot.cold_start_ms
    b.report([Outcome("glm", "ap", "ok", cold_start_ms=1000.0)])
    assert b.cold_start_ms("glm") == 1000.0 == b.snapshot().cold_start_ms["glm"]
    b.report([Outcome("glm", "ap", "ok", cold_start_ms=2000.0)])
    assert b.cold_start_ms("glm") == pytest.approx(1300.0)
    described = {d["region"]: d["models"]["glm"] for d in b.describe()}
    assert described["ap"]["replicas_wanted"] == 1 and described["ap"]["replicas_running"] == 0


def test_outcomes_for_unknown_pools_are_ignored() -> None:
    b = board(ManualClock())
    b.report([Outcome("gone", "eu", "failed"), Outcome("glm", "mars", "failed")])
    assert not b.pool("glm", "eu").ejected


# ---- config and the colo -> region map ------------------------------------------------------


def test_colos_belong_to_their_nearest_region_with_backhaul_rtt() -> None:
    config = EdgeConfig.from_mapping({"regions": REGIONS})
    regions = config.region_map()
    assert regions.names == ("eu", "us", "ap")
    assert regions.home("FRA") == "eu" and regions.home("NRT") == "ap"
    assert regions.home("GRU") == "us" and regions.home("SYD") == "ap"
    order = regions.from_colo("NRT")
    assert order[0][0] == "ap" and order[0][1] < order[1][1] < order[2][1]
    assert regions.from_colo("FRA")[0][1] < 2.0  # Frankfurt's own datacentre


def test_listed_colos_override_geography() -> None:
    regions = {**REGIONS, "eu": {**REGIONS["eu"], "colos": ["NRT"]}}
    config = EdgeConfig.from_mapping({"regions": regions})
    assert config.region_map().home("NRT") == "eu"
    assert config.region_map().from_colo("NRT")[0][0] == "eu"


def test_without_regions_there_is_one_pool_per_model_named_after_it() -> None:
    config = EdgeConfig.from_mapping({})
    assert config.region_names == (SINGLE_REGION,)
    assert config.region_map().from_colo("NRT") == ((SINGLE_REGION, 0.0),)
    assert deployment_name("glm", SINGLE_REGION) == "glm"
    assert deployment_name("glm", "eu") == "glm-eu"


def test_backhaul_off_makes_regions_free_to_reach() -> None:
    config = EdgeConfig.from_mapping({"regions": REGIONS, "region_policy": {"backhaul": False}})
    assert {rtt for _, rtt in config.region_map().from_colo("NRT")} == {0.0}


@pytest.mark.parametrize(
    ("regions", "problem"),
    [
        ({"EU": REGIONS["eu"]}, "lower-case"),
        ({"eu": {**REGIONS["eu"], "colos": ["XXX"]}}, "unknown colo 'XXX'"),
        (
            {"eu": {**REGIONS["eu"], "colos": ["FRA"]}, "us": {**REGIONS["us"], "colos": ["FRA"]}},
            "already in region 'eu'",
        ),
        ({}, "at least one region"),
        ({"eu": {"lat": 91, "lon": 0}}, "between -90 and 90"),
    ],
)
def test_bad_regions_are_named(regions: dict[str, object], problem: str) -> None:
    with pytest.raises(EdgeConfigError, match=problem):
        EdgeConfig.from_mapping({"regions": regions})


def test_admin_colo_states_name_each_colos_region() -> None:
    from edge_sim.geo import CountryCentroids
    from edge_sim.network import EdgeNetwork

    network = EdgeNetwork(
        EdgeConfig.from_mapping({"regions": REGIONS}), centroids=CountryCentroids({})
    )
    regions = {state["id"]: state["region"] for state in network.colo_states()}
    assert regions["NRT"] == "ap" and regions["FRA"] == "eu" and regions["ORD"] == "us"
