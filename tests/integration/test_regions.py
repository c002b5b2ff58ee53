"""Regions on one node (the embedded default: regions share the node): a cold region's clients
are served by a warm one while Serve really scales theirs up; with every region warm, each city
is served from its nearest region; a region drill fails requests in the replicas and traffic
fails over; overload answers or sheds with Retry-After and ejects nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from region_app import (
    ADMIN,
    CITY_PROBES,
    CLUSTER_ENV,
    LOAD,
    RegionApp,
    embed,
    free_port,
    region_config,
    running_app,
    wait_until,
)

from edgectl.local_cluster import LocalCluster

SCALE_UP_S = 180  # a replica start on a loaded 2-core machine takes up to a minute or two
# Moderation gets tiny queues, so a burst from one city meets Serve's real back-pressure.
TIGHT = {"moderation": {"max_ongoing_requests": 1, "max_queued_requests": 2}}


@pytest.fixture(scope="module")
def app(models_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegionApp]:
    ray = LocalCluster.start(num_cpus=4, env=CLUSTER_ENV)
    try:
        config = region_config(
            models_root,
            free_port(),
            {"embedding": {"eu": 1, "us": 0, "ap": 0}, "moderation": {"eu": 1, "us": 0, "ap": 0}},
            TIGHT,
        )
        # Routers coalesce concurrent moderation calls: a tight bound on what they hold, so the
        # burst meets back-pressure there as well as at Serve's queue.
        coalesce = config["applications"][0]["args"]["router"]["coalesce"]
        coalesce.update(max_calls_in_flight=1, max_waiting_requests=2)
        yield from running_app(ray, tmp_path_factory.mktemp("regions"), config)
    finally:
        ray.stop()


@pytest.fixture
def http(app: RegionApp) -> Iterator[httpx.Client]:
    with app.client() as client:
        yield client


def test_a_cold_regions_clients_detour_to_a_warm_one_while_theirs_really_scales_up(app, http):
    assert app.running("embedding-ap") == 0 and app.running("embedding-eu") == 1
    first = embed(http, "tokyo")
    assert first.status_code == 200
    assert first.headers["x-edge-colo"] == "NRT"
    assert first.headers["x-edge-region"] == "eu"  # served by the warm region...
    assert first.headers["x-edge-route-reason"] == "warm"  # ...and marked as such
    assert first.headers["x-edge-cold-start"] == "0"
    # The detour woke the nearest region: Serve itself starts a replica for it.
    wait_until(lambda: app.running("embedding-ap") == 1, SCALE_UP_S, "embedding-ap scaled up")
    later = wait_until(
        lambda: (r := embed(http, "tokyo")).headers["x-edge-region"] == "ap" and r,
        10,
        "Tokyo served from ap",
    )
    assert later.headers["x-edge-route-reason"] == "nearest"
    assert later.headers["x-edge-cold-start"] == "0"
    regions = app.regions()
    assert regions["ap"]["models"]["embedding"]["replicas_running"] == 1
    assert regions["us"]["models"]["embedding"]["replicas_running"] == 0


def test_with_every_region_warm_each_city_is_served_from_its_nearest_region(app, http):
    assert embed(http, "new_york").headers["x-edge-route-reason"] == "warm"  # wakes us
    wait_until(lambda: app.running("embedding-us") == 1, SCALE_UP_S, "embedding-us scaled up")
    # Each router replica learns it on its own next sync: a run of answers from us, not one.
    wait_until(
        lambda: all(embed(http, "new_york").headers["x-edge-region"] == "us" for _ in range(8)),
        10,
        "us seen warm by every router replica",
    )
    for _ in range(3):
        for city, (_, region) in CITY_PROBES.items():
            response = embed(http, city)
            assert response.status_code == 200
            served = (response.headers["x-edge-region"], response.headers["x-edge-route-reason"])
            assert served == (region, "nearest"), city


def test_a_region_drill_fails_requests_in_its_replicas_and_they_fail_over(app, http):
    assert http.post("/admin/regions/ap/faults", json={"down": True}, headers=ADMIN).is_success
    try:
        answers = [embed(http, "tokyo") for _ in range(12)]
        assert [r.status_code for r in answers] == [200] * 12  # none lost
        assert {r.headers["x-edge-region"] for r in answers} <= {"eu", "us"}
        assert answers[0].headers["x-edge-route-reason"] == "failover"
        assert answers[0].headers["x-edge-failover"].startswith("ap,")  # ap's replica refused
        ap = app.regions()["ap"]
        assert ap["faults"] and ap["faults"][0]["down"]
        # Real errors, from the replica: routers hand them to edge-control on their next sync
        # (every 0.5 s), and twelve requests that fail over at once can finish before it. All
        # of them, before the drill ends: a late one would eject ap during the next test.
        failed_on_ap = sum(
            r.headers.get("x-edge-failover", "").split(",").count("ap") for r in answers
        )
        assert failed_on_ap >= 1
        wait_until(
            lambda: app.regions()["ap"]["models"]["embedding"]["failures"] >= failed_on_ap,
            10,
            f"ap's {failed_on_ap} failures on edge-control's board",
        )
    finally:
        assert http.delete("/admin/regions/ap/faults", headers=ADMIN).is_success
    # Ejected for a few seconds at most, then a probe finds ap healthy again.
    wait_until(
        lambda: embed(http, "tokyo").headers["x-edge-region"] == "ap", 60, "Tokyo back on ap"
    )


async def _burst(base_url: str, seconds: float, concurrency: int) -> list[httpx.Response]:
    geo, _ = CITY_PROBES["frankfurt"]
    body = {"model": "moderation", "input": [f"text {n}" for n in range(16)]}
    headers = {**LOAD, "x-client-geo": geo, "x-edge-cache": "bypass"}
    answers: list[httpx.Response] = []
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + seconds
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:

        async def worker() -> None:
            while loop.time() < stop_at:
                answers.append(await client.post("/v1/moderations", json=body, headers=headers))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return answers


def _ejections(app: RegionApp) -> dict[tuple[str, str], int]:
    return {
        (name, model): state["health"]["ejections"]
        for name, region in app.regions().items()
        for model, state in region["models"].items()
    }


def test_overload_from_one_city_sheds_with_retry_after_and_ejects_nothing(app, http):
    ejections_before = _ejections(app)  # the drill above may have left one, being forgiven

    async def overload_while_embedding() -> tuple[list[httpx.Response], list[int]]:
        burst = asyncio.ensure_future(_burst(app.base_url, seconds=20, concurrency=48))
        others = []
        while not burst.done():
            others.append((await asyncio.to_thread(embed, http, "frankfurt")).status_code)
            await asyncio.sleep(0.5)
        return await burst, others

    answers, embeddings = asyncio.run(overload_while_embedding())
    statuses = {r.status_code for r in answers}
    assert statuses <= {200, 429, 503}, statuses
    shed = [r for r in answers if r.status_code != 200]
    assert all("retry-after" in r.headers for r in shed)
    assert any(r.status_code == 200 for r in answers)
    assert embeddings and set(embeddings) == {200}  # another model from that city: unaffected
    regions = app.regions()
    assert sum(r["models"]["moderation"]["back_pressure"] for r in regions.values()) > 0
    for name, region in regions.items():
        for model, state in region["models"].items():
            # A pool the drill above ejected stays half-open until a request probes it (no
            # traffic reaches it here); any other pool must be healthy.
            drilled = ejections_before[(name, model)] > 0
            allowed = {"healthy", "half_open"} if drilled else {"healthy"}
            assert state["health"]["state"] in allowed, (name, model, state["health"])
            assert state["failures"] == 0 or model == "embedding", (name, model)
    assert all(
        count <= ejections_before[key] for key, count in _ejections(app).items()
    )  # back-pressure ejected nothing
    # Right after: the same city's moderation requests are answered again.
    geo, _ = CITY_PROBES["frankfurt"]
    recovered = http.post(
        "/v1/moderations",
        json={"model": "moderation", "input": "hello"},
        headers={"x-client-geo": geo, "x-edge-cache": "bypass"},
    )
    assert recovered.status_code == 200
