"""The dashboard's data without Ray or HTTP: recent traffic added up over router replicas, colo
display states, replicas per region, the world outline."""

from __future__ import annotations

from typing import Any

import pytest

from deployments.contracts.edge_control_deployment import EdgeControlClient
from deployments.ingress.dashboard.data import (
    ReplicaCount,
    colo_display_state,
    dashboard_data,
    replica_counts,
)
from deployments.ingress.dashboard.world import ring_path, world_outline
from deployments.observability.outcome import RequestOutcome
from deployments.observability.recent_traffic import (
    BUCKET_S,
    RecentTraffic,
    latency_bucket,
    summarize,
)
from edge_sim.clock import ManualClock
from edge_sim.region_board import Outcome, RegionBoard
from edge_sim.regions import RegionPolicy


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def outcome(**overrides: Any) -> RequestOutcome:
    fields: dict[str, Any] = {
        "endpoint": "/v1/chat/completions",
        "model": "glm",
        "status": 200,
        "latency_s": 0.1,
        "colo": "LHR",
        "route_reason": "nearest",
        "operation": "chat",
    }
    return RequestOutcome(**{**fields, **overrides})


def test_two_replicas_add_up_to_rates_percentiles_and_reasons():
    clock = Clock()
    a, b = RecentTraffic(clock=clock), RecentTraffic(clock=clock)
    for _ in range(90):
        a.record(outcome(latency_s=0.1))
    for _ in range(9):
        b.record(outcome(latency_s=0.5, route_reason="failover"))
    b.record(outcome(latency_s=2.0, status=503, route_reason="spillover"))
    b.record(outcome(model="kimi", colo="SIN", cold_start_ms=2500.0,
                     cold_start_phases=(("model_load", 2.0),)))  # fmt: skip
    a.record(outcome(endpoint="/v1/models", model=None, operation=None))  # not a model call

    summary = summarize([a.snapshot(), b.snapshot()], clock.now)
    rows = {(row["place"], row["model"]): row for row in summary["traffic"]}
    glm = rows[("LHR", "glm")]
    assert glm["requests"] == 100 and glm["errors"] == 1
    assert glm["requests_per_s"] == pytest.approx(100 / 60, abs=1e-3)
    # Percentiles are bucket upper bounds, within 12% above the true value.
    assert 0.1 <= glm["p50_s"] <= 0.1 * 1.12
    assert 0.5 <= glm["p99_s"] <= 0.5 * 1.12
    assert sum(glm["series"]) == 100 and glm["series"][-1] == 100
    assert summary["route_reasons"] == {"failover": 9, "nearest": 91, "spillover": 1}
    assert summary["keys"] == []  # no authenticated request among these
    [cold] = summary["cold_starts"]
    assert (cold["model"], cold["place"], cold["wait_s"]) == ("kimi", "SIN", 2.5)
    assert cold["phases"] == {"model_load": 2.0}


def test_old_traffic_leaves_the_window_and_the_rate_counts_the_last_minute_only():
    clock = Clock()
    traffic = RecentTraffic(window_s=120, clock=clock)
    traffic.record(outcome())
    clock.now += 90
    traffic.record(outcome())
    summary = summarize([traffic.snapshot()], clock.now, window_s=120)
    [row] = summary["traffic"]
    assert row["requests"] == 2 and row["requests_per_s"] == pytest.approx(1 / 60, abs=1e-3)
    assert len(row["series"]) == 120 // BUCKET_S
    clock.now += 60
    [row] = summarize([traffic.snapshot()], clock.now, window_s=120)["traffic"]
    assert row["requests"] == 1  # the first one is older than the window now
    clock.now += 200
    assert traffic.snapshot()["cells"] == []


def test_top_keys_by_cost_then_requests_over_replicas():
    from deployments.observability.config import ModelPrice

    prices = {"glm": ModelPrice(per_request=1.0, per_million_output_tokens=1e6)}
    clock = Clock()
    a = RecentTraffic(clock=clock, prices=prices)
    b = RecentTraffic(clock=clock, prices=prices)
    a.record(outcome(key_id="alice", input_tokens=10, output_tokens=2))  # 1 + 2 units
    b.record(outcome(key_id="alice", status=503))  # counted, costs nothing
    for _ in range(5):
        b.record(outcome(key_id="bob", model="kimi", input_tokens=1))  # kimi has no price
    b.record(outcome(key_id="carol", output_tokens=1))  # 2 units
    keys = summarize([a.snapshot(), b.snapshot()], clock.now)["keys"]
    assert [(k["key_id"], k["requests"], k["cost_units"]) for k in keys] == [
        ("alice", 2, 3.0),
        ("carol", 1, 2.0),
        ("bob", 5, 0.0),
    ]
    assert keys[0]["input_tokens"] == 10 and keys[0]["output_tokens"] == 2
    clock.now += 400
    assert summarize([a.snapshot()], clock.now)["keys"] == []


def test_latency_buckets_cover_a_millisecond_to_minutes():
    assert latency_bucket(0.0) == 0
    assert latency_bucket(0.001) == 0
    assert latency_bucket(10_000.0) == latency_bucket(1e9)  # clamped into the last bucket


@pytest.mark.parametrize(
    ("colo", "region_healthy", "state"),
    [
        ({"faults": []}, True, "healthy"),
        ({"faults": []}, False, "degraded"),
        ({"faults": [{"active": True, "down": True}]}, True, "down"),
        ({"faults": [{"active": True, "down": True}]}, False, "down"),
        ({"faults": [{"active": False, "down": True}]}, True, "healthy"),
        ({"faults": [{"active": True, "down": False, "error_rate": 0.5}]}, True, "healthy"),
        ({"faults": [], "status": "planned"}, True, "down"),
    ],
)
def test_colo_display_state(colo: dict[str, Any], region_healthy: bool, state: str):
    assert colo_display_state(colo, region_healthy) == state


def test_replicas_wanted_count_the_ones_starting():
    assert replica_counts({"RUNNING": 1, "STARTING": 2, "STOPPING": 1}) == ReplicaCount(1, 3)
    assert replica_counts({}) == ReplicaCount(0, 0)


COLO = {
    "id": "FRA",
    "city": "Frankfurt",
    "country": "DE",
    "lat": 50.1,
    "lon": 8.7,
    "region": "eu",
    "status": "active",
    "faults": [
        {"active": True, "down": False, "added_latency_ms": 200.0, "error_rate": 0.0,
         "ends_in_s": 30.0}
    ],
}  # fmt: skip


def test_payload_without_regions_is_the_cluster_with_serve_replica_counts():
    data = dashboard_data(
        now=1_000_000.0,
        colos=[COLO],
        models=["glm", "kimi"],
        replica_states={"glm": {"RUNNING": 1}, "kimi": {"STARTING": 1}},
        traffic_snapshots=[],
    )
    [colo] = data["colos"]
    assert colo["state"] == "healthy"
    assert colo["drill"] == {
        "down": False,
        "added_latency_ms": 200.0,
        "error_rate": 0.0,
        "ends_in_s": 30.0,
    }
    [region] = data["regions"]
    assert region["id"] == "cluster" and region["source"] == "serve"
    assert region["replicas"] == {
        "glm": {"running": 1, "wanted": 1},
        "kimi": {"running": 0, "wanted": 1},
    }
    assert data["traffic"] == [] and data["cold_starts"] == []


def test_payload_uses_real_regions_from_the_region_board():
    """The payload edge-control really serves (RegionBoard.describe), not a hand-made shape:
    a pool ejected by real failures makes its region, and the colos homed there, unhealthy."""
    clock = ManualClock()
    board = RegionBoard(
        ["glm"], ["eu", "us"], RegionPolicy(), default_cold_start_ms=3000.0, clock=clock
    )
    board.set_replicas({("glm", "eu"): 1}, {("glm", "eu"): 2, ("glm", "us"): 0})
    board.report([Outcome("glm", "us", "failed")] * RegionPolicy().health.consecutive_failures)
    described = board.describe()
    assert described[1]["models"]["glm"]["health"]["state"] == "ejected"  # the premise
    us_colo = {**COLO, "id": "IAD", "region": "us", "faults": []}
    data = dashboard_data(
        now=0.0,
        colos=[COLO, us_colo],
        models=["glm"],
        replica_states={},
        traffic_snapshots=[],
        regions=described,
    )
    assert [(r["id"], r["healthy"], r["replicas"]["glm"]) for r in data["regions"]] == [
        ("eu", True, {"running": 1, "wanted": 2}),
        ("us", False, {"running": 0, "wanted": 0}),
    ]
    assert [(c["id"], c["state"]) for c in data["colos"]] == [
        ("FRA", "healthy"),
        ("IAD", "degraded"),
    ]


def test_world_outline_from_countryinfo_shapes():
    outline = world_outline()
    assert outline["view_box"] == "-172 -84 368 150"
    by_id = {country["id"]: country for country in outline["countries"]}
    assert len(by_id) > 150 and {"FRA", "JPN", "BRA", "AUS", "USA"} <= set(by_id)
    assert by_id["FRA"]["d"].startswith("M") and by_id["FRA"]["d"].endswith("Z")
    # y is minus the latitude: Paris-ish points have y near -48.
    assert ring_path([(2.35, 48.85), (2.36, 48.86), (3.0, 49.0), (3.0, 48.0)]) == (
        "M2.4,-48.9L3,-49L3,-48Z"
    )
    assert ring_path([(0, 0), (0.01, 0.01)]) == ""  # collapses to nothing at this scale


class FakeControl:
    """The edge-control deployment's handle, calling a real EdgeControl in this process."""

    def __init__(self, clock: Clock) -> None:
        from deployments.control.edge_control import EdgeControl

        self.control = EdgeControl(clock=clock)
        for name in ("report_traffic", "traffic"):
            setattr(self, name, _Remote(getattr(self.control, name)))


class _Remote:
    def __init__(self, method: Any):
        self.remote = method


def test_router_replicas_share_their_traffic_through_edge_control():
    import asyncio

    from deployments.ingress.serving.dashboard import TrafficShare

    clock = Clock()
    control = FakeControl(clock)
    client = EdgeControlClient(control)
    replicas = [TrafficShare(RecentTraffic(clock=clock), client, f"r{i}") for i in range(2)]
    replicas[0].recent.record(outcome())
    replicas[1].recent.record(outcome(colo="SIN"))

    async def run() -> list[dict[str, Any]]:
        for replica in replicas:
            await replica.publish()
        replicas[0].recent.record(outcome())  # not published yet: its own view is fresh anyway
        return await replicas[0].snapshots()

    snapshots = asyncio.run(run())
    assert len(snapshots) == 2  # its own, then the other one's, never its own twice
    rows = {row["place"]: row["requests"] for row in summarize(snapshots, clock.now)["traffic"]}
    assert rows == {"LHR": 2, "SIN": 1}

    # A replica that stops publishing drops out after a while.
    clock.now += 60
    assert asyncio.run(control.control.traffic()) == {}


def test_a_replica_publishes_its_traffic_when_it_has_new_requests_and_now_and_then_otherwise(
    monkeypatch: pytest.MonkeyPatch,
):
    import asyncio

    from deployments.ingress.serving import dashboard
    from deployments.ingress.serving.dashboard import TrafficShare

    monkeypatch.setattr(dashboard, "PUBLISH_INTERVAL_S", 0.001)
    monkeypatch.setattr(dashboard, "IDLE_PUBLISH_INTERVAL_S", 3600.0)
    published: list[int] = []

    class CountingControl:
        def __init__(self) -> None:
            self.report_traffic = _Remote(self._report)

        async def _report(self, replica_id: str, snapshot: dict[str, Any]) -> None:
            published.append(sum(cell[3]["requests"] for cell in snapshot["cells"]))

    share = TrafficShare(RecentTraffic(), EdgeControlClient(CountingControl()), "r0")

    async def until(count: int) -> None:
        async with asyncio.timeout(5):
            while len(published) < count:
                await asyncio.sleep(0)

    async def turns(count: int) -> None:
        for _ in range(count):
            await asyncio.sleep(0)

    async def run() -> None:
        publishing = asyncio.get_running_loop().create_task(share.publish_forever())
        await until(1)
        await turns(50)
        assert published == [0]  # at once, then nothing new to say
        share.recent.record(outcome())
        await until(2)
        await turns(50)
        assert published == [0, 1]  # the new request, once
        monkeypatch.setattr(dashboard, "IDLE_PUBLISH_INTERVAL_S", 0.01)
        await until(3)
        assert published[2] == 1  # still there, now and then
        publishing.cancel()

    asyncio.run(run())
