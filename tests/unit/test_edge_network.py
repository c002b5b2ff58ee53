"""EdgeNetwork facade: locating clients, ranking entry colos with drills, admin state."""

from __future__ import annotations

from typing import Any

import pytest

from edge_sim.clock import ManualClock
from edge_sim.config import EdgeConfig
from edge_sim.faults import ColoFault
from edge_sim.geo import BadHeaderError, CountryCentroids
from edge_sim.network import EdgeNetwork
from edge_sim.topology import UnknownColoError

# Three colos on the equator, 1 degree (~111 km) apart; a client at lon 0 prefers AAA, BBB, CCC.
COLOS = [
    {"id": "AAA", "city": "A", "country": "GH", "lat": 0.0, "lon": 0.0},
    {"id": "BBB", "city": "B", "country": "GH", "lat": 0.0, "lon": 1.0},
    {"id": "CCC", "city": "C", "country": "GH", "lat": 0.0, "lon": 2.0},
]
HERE = {"x-client-geo": "0,0"}


def network(clock: ManualClock | None = None, **config: Any) -> EdgeNetwork:
    settings: dict[str, Any] = {
        "topology": {"colos": COLOS},
        "default_location": {"lat": 0.0, "lon": 2.0, "country": None},
        **config,
    }
    return EdgeNetwork(
        EdgeConfig.model_validate(settings),
        clock=clock or ManualClock(),
        centroids=CountryCentroids({"GH": (0.0, 1.9)}),
    )


def order(net: EdgeNetwork, headers: dict[str, str] = HERE) -> list[str]:
    return [c.colo_id for c in net.route("m", headers).candidates]


def test_route_locates_the_client_and_ranks():
    net = network()
    plan = net.route("m", HERE)
    assert plan.model == "m" and plan.client.source == "header"
    assert [c.colo_id for c in plan.candidates] == ["AAA", "BBB", "CCC"]
    assert order(net, {"cf-ipcountry": "GH"}) == ["CCC", "BBB", "AAA"]
    assert order(net, {}) == ["CCC", "BBB", "AAA"]  # default location


def test_bad_header_propagates_for_a_400():
    with pytest.raises(BadHeaderError) as caught:
        network().route("m", {"cf-ipcountry": "QQ"})
    assert caught.value.header == "cf-ipcountry"


def test_down_fault_removes_a_colo_until_cleared():
    net = network()
    net.set_fault("AAA", ColoFault(down=True))
    assert order(net) == ["BBB", "CCC"]
    states = {s["id"]: s for s in net.colo_states()}
    assert states["AAA"]["healthy"] is False and states["AAA"]["faults"][0]["down"] is True
    assert states["BBB"]["healthy"] is True and states["BBB"]["faults"] == []
    net.clear_faults("AAA")
    assert order(net) == ["AAA", "BBB", "CCC"]


def test_added_latency_reorders_and_shows_in_rtt():
    net = network()
    before = net.route("m", HERE).candidates[0].rtt_ms
    net.set_fault("AAA", ColoFault(added_latency_ms=500.0))
    candidates = net.route("m", HERE).candidates
    assert [c.colo_id for c in candidates] == ["BBB", "CCC", "AAA"]
    assert candidates[2].rtt_ms == pytest.approx(before + 500.0)


def test_config_declared_outage_window():
    clock = ManualClock()
    net = network(clock, faults={"AAA": [{"down": True, "start_after_s": 60, "duration_s": 30}]})
    assert order(net)[0] == "AAA"
    clock.advance(60)
    assert order(net)[0] == "BBB"
    clock.advance(30)
    assert order(net)[0] == "AAA"


def test_injected_error_rate_is_seeded():
    def draws(seed: int) -> list[bool]:
        net = network(seed=seed)
        net.set_fault("AAA", ColoFault(error_rate=0.5))
        return [net.should_fail("AAA") for _ in range(200)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)
    assert not network().should_fail("AAA")


def test_delay_applies_scale_and_jitter():
    net = network(latency={"real_delay_scale": 0.5, "jitter_ms": 4.0})
    candidate = net.route("m", {"x-client-geo": "0,1.5"}).candidates[0]
    delays = [net.delay_s(candidate) for _ in range(200)]
    low, high = candidate.rtt_ms * 0.5 / 1000, (candidate.rtt_ms + 4.0) * 0.5 / 1000
    assert all(low <= d < high for d in delays)
    assert len(set(delays)) > 1
    off = network(latency={"real_delay_scale": 0})
    assert off.delay_s(off.route("m", HERE).candidates[0]) == 0.0


def test_unknown_colo_in_admin_calls():
    net = network()
    with pytest.raises(UnknownColoError):
        net.set_fault("ZZZ", ColoFault(down=True))
    with pytest.raises(UnknownColoError):
        net.clear_faults("ZZZ")


def test_colo_states_say_only_what_the_simulation_knows():
    """No in-flight counts or outlier state per colo: the request path keeps none (what is real
    about load and health is per region, from Serve and real failures: /admin/regions)."""
    state = network().colo_states()[0]
    assert set(state) == {
        "id", "city", "country", "region", "lat", "lon", "models", "status", "healthy", "faults"
    }  # fmt: skip
    assert (state["id"], state["models"], state["healthy"]) == ("AAA", "*", True)


def test_default_network_uses_shipped_topology_and_country_table():
    net = EdgeNetwork(EdgeConfig(), clock=ManualClock())
    assert net.route("m", {"cf-ipcountry": "AU"}).candidates[0].colo_id == "SYD"
    assert net.route("m", {"cf-ipcountry": "KE"}).candidates[0].colo_id == "NBO"
