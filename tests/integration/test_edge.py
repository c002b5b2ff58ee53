"""The simulated edge through the live router: geo routing, failover under load, the cache."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from conftest import ADMIN_KEY, wait_until

LONDON, TOKYO, SAO_PAULO = "51.5,-0.12", "35.68,139.69", "-23.55,-46.63"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


@pytest.fixture(scope="module")
def http(serve_cluster) -> httpx.Client:
    with httpx.Client(base_url=serve_cluster.base_url, timeout=120) as client:
        yield client


def moderate(http: httpx.Client, geo: str, text: str = "hello", **headers: str) -> httpx.Response:
    return http.post(
        "/v1/moderations",
        json={"input": text},
        headers={"x-client-geo": geo, "x-edge-cache": "bypass", **headers},
    )


def nearest_colo(http: httpx.Client, geo: str) -> str:
    return moderate(http, geo).headers["x-edge-colo"]


def test_clients_on_three_continents_land_on_their_nearest_colos(http):
    colos = {c["id"]: c for c in http.get("/admin/colos", headers=ADMIN).json()}
    moderate(http, LONDON)  # moderation is now warm at the London colo only
    first_from_tokyo = moderate(http, TOKYO)
    # Cold-start awareness: Tokyo's own colo is cold, so a warm colo serves while it warms up.
    assert first_from_tokyo.headers["x-edge-route-reason"] == "warm"
    assert colos[first_from_tokyo.headers["x-edge-colo"]]["country"] != "JP"

    def settled(geo: str) -> str | None:
        response = moderate(http, geo)
        assert response.status_code == 200
        if response.headers["x-edge-route-reason"] != "nearest":
            return None
        assert float(response.headers["x-edge-rtt-ms"]) < 60  # near, not across an ocean
        return response.headers["x-edge-colo"]

    seen = {
        geo: wait_until(lambda g=geo: settled(g), 20, f"{geo} on its nearest colo")
        for geo in (LONDON, TOKYO, SAO_PAULO)
    }
    assert len(set(seen.values())) == 3
    assert colos[seen[LONDON]]["country"] in ("GB", "FR", "NL", "BE", "IE")
    assert colos[seen[TOKYO]]["country"] == "JP"
    assert colos[seen[SAO_PAULO]]["country"] == "BR"


def test_country_header_and_bad_geo_header(http):
    by_country = http.post("/v1/moderations", json={"input": "hi"}, headers={"cf-ipcountry": "AU"})
    assert by_country.status_code == 200
    bad = http.post("/v1/moderations", json={"input": "hi"}, headers={"x-client-geo": "north"})
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "x-client-geo"


def test_admin_api_requires_the_admin_key(http):
    assert http.get("/admin/colos").status_code == 401
    assert http.get("/admin/colos", headers={"authorization": "Bearer wrong"}).status_code == 401
    assert (
        http.post("/admin/colos/XXX/faults", json={"down": True}, headers=ADMIN).status_code == 404
    )
    bad = http.post("/admin/colos/LHR/faults", json={"down": "sometimes"}, headers=ADMIN)
    assert bad.status_code == 400


def test_colo_down_mid_load_loses_no_request_and_traffic_returns(serve_cluster, http):
    home = nearest_colo(http, LONDON)
    total, down_after = 240, 60

    async def load() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(
            base_url=serve_cluster.base_url, timeout=120, limits=limits
        ) as c:
            gate = asyncio.Semaphore(12)

            async def one(i: int) -> httpx.Response:
                async with gate:
                    if i == down_after:
                        marked = await c.post(
                            f"/admin/colos/{home}/faults", json={"down": True}, headers=ADMIN
                        )
                        assert marked.status_code == 200
                    return await c.post(
                        "/v1/moderations",
                        json={"input": f"message {i}"},
                        headers={"x-client-geo": LONDON, "x-edge-cache": "bypass"},
                    )

            return await asyncio.gather(*(one(i) for i in range(total)))

    try:
        responses = asyncio.run(load())
        assert [r.status_code for r in responses].count(200) == total  # zero failed
        after = [r.headers["x-edge-colo"] for r in responses[down_after + 12 :]]
        assert after and home not in after
        fallback = set(after)
        assert len(fallback) == 1  # all served by the next nearest colo
        states = {c["id"]: c for c in http.get("/admin/colos", headers=ADMIN).json()}
        assert states[home]["healthy"] is False and states[home]["faults"]
    finally:
        assert http.delete(f"/admin/colos/{home}/faults", headers=ADMIN).status_code == 200
    assert nearest_colo(http, LONDON) == home  # traffic returns once the fault is cleared


def test_failover_on_injected_errors_is_reported(http):
    home = nearest_colo(http, TOKYO)
    http.post(f"/admin/colos/{home}/faults", json={"error_rate": 1.0}, headers=ADMIN)
    try:
        response = moderate(http, TOKYO)
        assert response.status_code == 200
        assert response.headers["x-edge-route-reason"] == "failover"
        tried = response.headers["x-edge-failover"].split(",")
        assert tried[0] == home and tried[-1] == response.headers["x-edge-colo"] != home
    finally:
        http.delete(f"/admin/colos/{home}/faults", headers=ADMIN)


def test_cache_hit_on_repeat_and_bypass(http):
    body = {"model": "embedding", "input": "cache me if you can"}
    first = http.post("/v1/embeddings", json=body, headers={"x-client-geo": LONDON})
    second = http.post("/v1/embeddings", json=body, headers={"x-client-geo": LONDON})
    assert first.headers["x-edge-cache"] == "MISS"
    assert second.headers["x-edge-cache"] == "HIT"
    assert second.json()["data"] == first.json()["data"]
    other_key = http.post(
        "/v1/embeddings", json=body, headers={"x-client-geo": LONDON, "authorization": "Bearer k2"}
    )
    assert other_key.headers["x-edge-cache"] == "MISS"  # never shared across credentials
    bypass = http.post("/v1/embeddings", json=body, headers={"x-edge-cache": "bypass"})
    assert "x-edge-cache" not in bypass.headers
