"""The edge suite's routing-decision benchmark runs against the shipped edge config schema (it
broke once when colos lost their capacity field and the ranker its warm-aware arguments)."""

from __future__ import annotations

from benchmarks.edge import decision_cost_us


def test_routing_decision_benchmark_routes_on_a_generated_topology() -> None:
    result = decision_cost_us(n_colos=30, repeat=5)
    assert result["colos"] == 30
    for key in ("route_geo_header_us", "route_country_us"):
        assert result[key] > 0, key
