"""Ranking entry colos: nearest by RTT, only colos that can serve, drills. (Warmth and
back-pressure are the regions': tests/unit/test_edge_regions.py.)"""

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
    with pytest.raises(NoColoAvailableError, match="all 2 colos serving it are down"):
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


def test_ties_keep_topology_order():
    rank = ranker(line_topology(("BBB", 1), ("AAA", -1)))
    assert ids(rank.rank("m", at(0, 0))) == ["BBB", "AAA"]


def test_a_kept_ranking_never_hides_a_drill_that_starts_or_ends():
    """Rankings are kept per client and drills: the same request ranks alike, a drill anew."""
    rank = ranker(line_topology(("AAA", 0), ("BBB", 1), ("CCC", 2)))
    client = at(0, 0)
    assert ids(rank.rank("m", client)) == ids(rank.rank("m", client)) == ["AAA", "BBB", "CCC"]
    assert ids(rank.rank("m", client, unavailable=["AAA"])) == ["BBB", "CCC"]
    assert ids(rank.rank("m", client, added_latency_ms={"AAA": 50.0})) == ["BBB", "CCC", "AAA"]
    assert ids(rank.rank("m", client)) == ["AAA", "BBB", "CCC"]  # the drills ended
    ranked = rank.rank("m", client)
    ranked.pop()  # the caller's list, not the kept one
    assert len(rank.rank("m", client)) == 3
