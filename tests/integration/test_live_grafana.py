"""Every metric the Grafana dashboard's queries name is on the live Prometheus endpoint after
traffic that exercises each of them: chat (streamed, cached), moderation flags, a 429, a
failover drill and a cold start."""

from __future__ import annotations

import httpx
import pytest
from conftest import (
    ADMIN_KEY,
    LIMITED_KEY,
    LIMITED_RPM,
    USER,
    wait_until,
)

from deployments.observability import grafana

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
# Counters Ray exports from their first increment only, whose event a session cannot cause without
# forcing it; each is unit-tested to advance on it (the test named beside it).
EVENT_ONLY = {
    "ray_edge_model_kv_preemptions_total",  # test_kv_budget_plain.py: a preemption
}
TOKYO = "35.68,139.69"


@pytest.fixture(scope="module")
def traffic(serve_cluster) -> None:
    with httpx.Client(base_url=serve_cluster.base_url, timeout=120, headers=USER) as http:
        chat = {"model": "glm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for _ in range(2):  # temperature 0: a cache miss, then a hit
            assert http.post("/v1/chat/completions", json={**chat, "temperature": 0}).is_success
        with http.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as r:
            assert r.status_code == 200 and r.read()
        flagged = http.post("/v1/moderations", json={"input": "you are a fucking idiot"})
        assert flagged.json()["results"][0]["flagged"]
        # Each router replica holds its share of the key's budget: enough requests for both.
        limited = {"authorization": f"Bearer {LIMITED_KEY}", "x-edge-cache": "bypass"}
        statuses = [
            http.post(
                "/v1/embeddings", json={"model": "embedding", "input": "x"}, headers=limited
            ).status_code
            for _ in range(2 * LIMITED_RPM + 2)
        ]
        assert 429 in statuses
        _failover(http)
        # kimi goes to zero replicas a few seconds after its last request: then a cold start.
        wait_until(
            lambda: serve_cluster.running_replicas("kimi") == 0, 120, "kimi at zero replicas", 2
        )
        kimi = {**chat, "model": "kimi"}
        cold = http.post("/v1/chat/completions", json=kimi)
        assert cold.status_code == 200 and cold.headers["x-edge-cold-start"] == "1"


def _failover(http: httpx.Client) -> None:
    def moderate() -> httpx.Response:
        return http.post(
            "/v1/moderations",
            json={"input": "hello"},
            headers={"x-client-geo": TOKYO, "x-edge-cache": "bypass"},
        )

    home = moderate().headers["x-edge-colo"]
    http.post(f"/admin/colos/{home}/faults", json={"error_rate": 1.0}, headers=ADMIN)
    try:
        wait_until(
            lambda: moderate().headers["x-edge-route-reason"] == "failover", 10, "a failover"
        )
    finally:
        http.delete(f"/admin/colos/{home}/faults", headers=ADMIN)


def exported_names(metrics_url: str) -> set[str]:
    text = httpx.get(metrics_url, timeout=10).text
    return {
        line.split("{")[0].split(" ")[0]
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_every_metric_the_dashboard_queries_is_exported(traffic, serve_cluster):
    wanted = grafana.metric_names(grafana.dashboard()) - EVENT_ONLY

    def missing() -> set[str]:
        return wanted - exported_names(serve_cluster.metrics_url)

    # Ray exports what replicas record every few seconds: wait until nothing is missing.
    try:
        wait_until(lambda: not missing(), 120, "every dashboard metric on /metrics", every_s=3)
    except TimeoutError:
        pytest.fail(f"not exported after traffic: {sorted(missing())}")
