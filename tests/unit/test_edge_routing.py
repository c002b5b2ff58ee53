"""Ranking colos: nearest by RTT, only colos that can serve, spillover, cold-start awareness."""

from __future__ import annotations

import random

import pytest

from edge_sim.geo import ClientLocation, haversine_km
from edge_sim.latency import LatencyModel
from edge_sim.routing import ColoRanker, NoColoAvailableError, RoutingConfig
from edge_sim.topology import Topology

LATENCY = LatencyModel()


def ranker(topology: Topology | None = None, **routing: object) -> ColoRanker:
    return ColoRanker(
        topology or Topology.default(), LATENCY, RoutingConfig.model_validate(routing)
    )


def at(lat: float, lon: float) -> ClientLocation:
    return ClientLocation(lat, lon, "header")


def ids(candidates) -> list[str]:
    return [c.colo_id for c in candidates]


def line_topology(*colos: tuple[str, float], **extra: dict[str, object]) -> Topology:
    """Colos on the equator at the given longitudes (1 degree ~ 111 km)."""
    return Topology.model_validate(
        {
            "colos": [
                {"id": i, "city": i, "country": "XX", "lat": 0.0, "lon": lon, **extra.get(i, {})}
                for i, lon in colos
            ]
        }
    )


@pytest.mark.parametrize(
    ("client", "nearest"),
    [
        ((48.8566, 2.3522), "CDG"),  # Paris
        ((51.5074, -0.1278), "LHR"),  # London
        ((52.2297, 21.0122), "WAW"),  # Warsaw
        ((35.6762, 139.6503), "NRT"),  # Tokyo
        ((1.3521, 103.8198), "SIN"),  # Singapore
        ((19.0760, 72.8777), "BOM"),  # Mumbai
        ((40.7128, -74.0060), "IAD"),  # New York: Ashburn beats Toronto and Chicago
        ((37.7749, -122.4194), "SJC"),  # San Francisco
        ((-23.5505, -46.6333), "GRU"),  # Sao Paulo
        ((-34.6037, -58.3816), "SCL"),  # Buenos Aires: Santiago (1,140 km) beats Sao Paulo
        ((-33.8688, 151.2093), "SYD"),  # Sydney
        ((6.5244, 3.3792), "LOS"),  # Lagos
    ],
)
def test_nearest_colo_for_clients_on_every_continent(client, nearest):
    assert ranker().rank("m", at(*client))[0].colo_id == nearest


def test_order_is_by_great_circle_distance_for_random_clients():
    topology = Topology.default()
    rank = ranker(topology, max_candidates=6)
    rng = random.Random(3)
    for _ in range(50):
        client = at(rng.uniform(-60, 70), rng.uniform(-180, 180))
        by_haversine = sorted(
            topology.colos, key=lambda c: haversine_km(client.lat, client.lon, c.lat, c.lon)
        )
        candidates = rank.rank("m", client)
        assert ids(candidates) == [c.id for c in by_haversine[:6]]
        for candidate, colo in zip(candidates, by_haversine, strict=False):
            expected_km = haversine_km(client.lat, client.lon, colo.lat, colo.lon)
            assert candidate.distance_km == pytest.approx(expected_km, abs=0.5)
            assert candidate.rtt_ms == pytest.approx(LATENCY.rtt_ms(expected_km), abs=0.01)
        assert [c.reason for c in candidates] == ["nearest"] * 6


def test_rtt_model_london_new_york():
    # 5,570 km x 1.5 inflation / 200,000 km/s = 41.8 ms one way; plus hops -> ~90 ms RTT.
    rtt = LATENCY.rtt_ms(5570)
    assert 2 * 5570 * 1.5 / 200_000 * 1000 < rtt < 100
    assert LATENCY.rtt_ms(0) == pytest.approx(2 * LATENCY.per_hop_ms)


def test_failover_list_is_capped():
    assert len(ranker(max_candidates=3).rank("m", at(0, 0))) == 3
    assert len(ranker(line_topology(("AAA", 0)), max_candidates=3).rank("m", at(0, 0))) == 1


def test_only_colos_serving_the_model_in_active_status():
    topology = line_topology(
        ("AAA", 0),
        ("BBB", 1),
        ("CCC", 2),
        ("DDD", 3),
        AAA={"models": ["kimi"]},
        BBB={"status": "maintenance"},
        CCC={"models": ["glm", "kimi"]},
    )
    rank = ranker(topology)
    assert ids(rank.rank("glm", at(0, 0))) == ["CCC", "DDD"]
    assert ids(rank.rank("kimi", at(0, 0))) == ["AAA", "CCC", "DDD"]
    assert ids(rank.rank("unlisted", at(0, 0))) == ["DDD"]


def test_unavailable_colos_are_skipped():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 1), ("CCC", 2)))
    assert ids(rank.rank("m", at(0, 0), unavailable={"AAA", "CCC", "ZZZ"})) == ["BBB"]


def test_no_colo_errors_say_why():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 1), AAA={"models": ["glm"]}))
    with pytest.raises(NoColoAvailableError, match="all 2 colos serving it are down or ejected"):
        rank.rank("glm", at(0, 0), unavailable=["AAA", "BBB"])
    only_glm = ranker(line_topology(("AAA", 0), AAA={"models": ["glm"]}))
    with pytest.raises(NoColoAvailableError, match="no active colo serves model 'kimi'") as caught:
        only_glm.rank("kimi", at(0, 0))
    assert caught.value.model == "kimi"


def test_added_fault_latency_reorders():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 1), ("CCC", 2)))
    candidates = rank.rank("m", at(0, 0), added_latency_ms={"AAA": 50.0})
    assert ids(candidates) == ["BBB", "CCC", "AAA"]
    assert candidates[2].rtt_ms == pytest.approx(LATENCY.rtt_ms(0) + 50.0)


def test_full_colo_moves_behind_colos_with_room_and_first_says_spillover():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 1), ("CCC", 2)))
    candidates = rank.rank("m", at(0, 0), full={"AAA"})
    assert ids(candidates) == ["BBB", "CCC", "AAA"]
    assert [c.reason for c in candidates] == ["spillover", "nearest", "nearest"]


def test_full_colo_that_is_not_nearest_changes_no_reason():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 1), ("CCC", 2)))
    candidates = rank.rank("m", at(0, 0), full={"BBB"})
    assert ids(candidates) == ["AAA", "CCC", "BBB"]
    assert candidates[0].reason == "nearest"


def test_all_full_keeps_rtt_order():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 1)))
    assert ids(rank.rank("m", at(0, 1), full={"AAA", "BBB"})) == ["BBB", "AAA"]


def warm_only(*warm: str):
    return lambda colo_id, model: colo_id in warm


def test_warm_colo_goes_first_when_extra_rtt_is_below_cold_start():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 10), ("CCC", 20)))
    extra_ms = LATENCY.rtt_ms(haversine_km(0, 0, 0, 20)) - LATENCY.rtt_ms(0)
    candidates = rank.rank(
        "m", at(0, 0), is_warm=warm_only("CCC"), cold_start_ms=lambda model: extra_ms + 1
    )
    assert ids(candidates) == ["CCC", "AAA", "BBB"]
    assert [c.reason for c in candidates] == ["warm", "nearest", "nearest"]


def test_warm_colo_not_chosen_when_too_far():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 10), ("CCC", 20)))
    extra_ms = LATENCY.rtt_ms(haversine_km(0, 0, 0, 20)) - LATENCY.rtt_ms(0)
    candidates = rank.rank(
        "m", at(0, 0), is_warm=warm_only("CCC"), cold_start_ms=lambda model: extra_ms - 1
    )
    assert ids(candidates) == ["AAA", "BBB", "CCC"]
    assert candidates[0].reason == "nearest"


def test_nearest_warm_colo_is_preferred_among_warm_ones():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 10), ("CCC", 20)))
    candidates = rank.rank(
        "m", at(0, 0), is_warm=warm_only("BBB", "CCC"), cold_start_ms=lambda model: 10_000.0
    )
    assert ids(candidates)[0] == "BBB"


def test_warm_nearest_needs_no_detour():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 10)))
    candidates = rank.rank(
        "m", at(0, 0), is_warm=warm_only("AAA", "BBB"), cold_start_ms=lambda model: 10_000.0
    )
    assert ids(candidates) == ["AAA", "BBB"] and candidates[0].reason == "nearest"


def test_configured_max_extra_rtt_overrides_cold_start():
    topology = line_topology(("AAA", 0), ("BBB", 10))
    extra_ms = LATENCY.rtt_ms(haversine_km(0, 0, 0, 10)) - LATENCY.rtt_ms(0)
    big_cold_start = {"is_warm": warm_only("BBB"), "cold_start_ms": lambda model: 1e6}
    tight = ranker(topology, max_extra_rtt_ms=extra_ms - 1).rank("m", at(0, 0), **big_cold_start)
    assert ids(tight)[0] == "AAA"
    loose = ranker(topology, max_extra_rtt_ms=extra_ms + 1).rank("m", at(0, 0), **big_cold_start)
    assert ids(loose)[0] == "BBB"


def test_without_cold_start_time_no_detour():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 1)))
    assert ids(rank.rank("m", at(0, 0), is_warm=warm_only("BBB")))[0] == "AAA"


def test_full_warm_colo_is_not_a_detour_target():
    rank = ranker(line_topology(("AAA", 0), ("BBB", 1), ("CCC", 2)))
    candidates = rank.rank(
        "m",
        at(0, 0),
        full={"BBB"},
        is_warm=warm_only("BBB", "CCC"),
        cold_start_ms=lambda model: 10_000.0,
    )
    assert ids(candidates) == ["CCC", "AAA", "BBB"]
    assert candidates[0].reason == "warm"


def test_warm_colo_beyond_the_candidate_cap_still_goes_first():
    topology = line_topology(*[(f"A{chr(65 + i)}A", float(i)) for i in range(8)])
    candidates = ranker(topology, max_candidates=3).rank(
        "m", at(0, 0), is_warm=warm_only("AHA"), cold_start_ms=lambda model: 10_000.0
    )
    assert ids(candidates) == ["AHA", "AAA", "ABA"]


def test_ties_keep_topology_order():
    rank = ranker(line_topology(("BBB", 1), ("AAA", -1)))
    assert ids(rank.rank("m", at(0, 0))) == ["BBB", "AAA"]
