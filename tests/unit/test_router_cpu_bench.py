"""The router_cpu suite drives the real router app on fake model handles: every endpoint it
measures must answer 200 through today's services (its fakes once fell behind the chat
server's interface and the suite failed on a 500)."""

from __future__ import annotations

from benchmarks.router_cpu import endpoints, run_router_cpu_suite


def test_every_measured_endpoint_answers_through_the_real_app() -> None:
    result = run_router_cpu_suite(requests=2, rounds=1)
    assert set(result["endpoints"]) == set(endpoints("glm", "embedding"))
    for name, measured in result["endpoints"].items():
        assert measured["cpu_us_per_request"] > 0, name
    assert result["goals"]["embedding_router_app_cpu_us"]["value"] > 0
