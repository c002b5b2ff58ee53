"""The edge suite's routing-decision benchmark runs against the shipped edge config schema (it
broke once when colos lost their capacity field and the ranker its warm-aware arguments), and the
failover drill is judged on its p99 bound and its failures apart."""

from __future__ import annotations

from benchmarks.edge import decision_cost_us, goals


def test_routing_decision_benchmark_routes_on_a_generated_topology() -> None:
    result = decision_cost_us(n_colos=30, repeat=5)
    assert result["colos"] == 30
    for key in ("route_geo_header_us", "route_country_us"):
        assert result[key] > 0, key


def test_the_drill_is_missed_by_a_failure_even_within_its_p99_bound() -> None:
    decision = {"route_geo_header_us": 20.0}
    drill = {"outage": {"p99_ms": 90.0}, "p99_bound_ms": 120.0, "failed_total": 1}
    verdicts = goals(decision, drill)
    assert verdicts["routing_decision_us_300_colos"]["met"] is True
    assert verdicts["failover_drill_p99_during_outage"]["met"] is True
    assert verdicts["failover_drill_failed_requests"]["met"] is False
    unbounded = goals(decision, {**drill, "p99_bound_ms": None})
    assert unbounded["failover_drill_p99_during_outage"]["met"] is False
    assert "no p99 before" in unbounded["failover_drill_p99_during_outage"]["missing"]
