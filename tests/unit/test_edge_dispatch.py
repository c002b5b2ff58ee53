"""EdgeDispatcher with fake region handles: where a request is served, what wakes, what spills,
what fails over, and what the shared state is told (no Ray)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from deployments.edge import EdgeDispatcher, RegionPools
from deployments.errors import (
    InvalidRequestError,
    OverloadedError,
    QueueFullError,
    RegionFaultError,
)
from deployments.servers.base import Reply
from edge_sim.config import EdgeConfig
from edge_sim.geo import CountryCentroids
from edge_sim.network import EdgeNetwork
from edge_sim.region_board import BoardSnapshot, Outcome
from edge_sim.regions import PoolView

MODEL = "m"
REGIONS = {
    "eu": {"lat": 50.11, "lon": 8.68},
    "us": {"lat": 39.04, "lon": -77.49},
    "ap": {"lat": 1.36, "lon": 103.99},
}
TOKYO = {"x-client-geo": "35.68,139.69"}
FRANKFURT = {"x-client-geo": "50.11,8.68"}


class FakeMethod:
    def __init__(self, region: FakeRegion, name: str):
        self.region, self.name = region, name

    def remote(self, *args: Any) -> Any:
        self.region.calls.append(self.name)
        return self.region.behaviour(self.name)


class FakeRegion:
    """A region's deployment handle: `behaviour(method)` returns the awaitable a call gives."""

    def __init__(self, name: str):
        self.name = name
        self.calls: list[str] = []
        self.behaviour: Callable[[str], Any] = lambda method: _ok(name)

    def __getattr__(self, method: str) -> FakeMethod:
        return FakeMethod(self, method)


async def _ok(region: str, ready_at: float = 0.0) -> Reply[str]:
    return Reply(region, replica_ready_at=ready_at, replica_load_s=0.1)


async def _raise(error: BaseException) -> Any:
    raise error


class Rig:
    def __init__(self, running: dict[str, int], max_attempts: int = 3):
        config = EdgeConfig.from_mapping({"regions": REGIONS, "latency": {"real_delay_scale": 0}})
        self.handles = {region: FakeRegion(region) for region in REGIONS}
        self.pool_top_ups = 0  # the warm pool asked to replace a worker a cold start took
        self.pools = RegionPools(
            {MODEL: self.handles},
            config.region_policy,
            default_cold_start_ms=3000.0,
            after_cold_start=self._top_up_pool,
        )
        self.pools.snapshot = BoardSnapshot(
            {MODEL: {r: PoolView(running=n) for r, n in running.items()}}, {}
        )
        network = EdgeNetwork(config, centroids=CountryCentroids({}))
        self.dispatcher: EdgeDispatcher[Reply[str]] = EdgeDispatcher(
            network, config.region_map(), self.pools, max_attempts
        )
        self.reported: list[Outcome] = []
        original = self.pools.report

        def report(model: str, region: str, kind: Any, cold_ms: float | None = None) -> None:
            self.reported.append(Outcome(model, region, kind, cold_ms))
            original(model, region, kind, cold_ms)

        self.pools.report = report  # type: ignore[method-assign]

    def _top_up_pool(self) -> None:
        self.pool_top_ups += 1

    async def send(self, headers: dict[str, str], deadline_s: float = 5.0):
        return await self.dispatcher.dispatch(
            MODEL,
            headers,
            None,
            lambda handle: handle.complete.remote(),
            reply_of=lambda reply: reply,
            deadline_s=deadline_s,
        )


ALL_WARM = {"eu": 1, "us": 1, "ap": 1}
WARM = PoolView(running=1)


def test_all_warm_serves_from_the_nearest_region_and_says_so() -> None:
    rig = Rig(ALL_WARM)
    for headers, region, colo in ((TOKYO, "ap", "NRT"), (FRANKFURT, "eu", "FRA")):
        reply, trace = asyncio.run(rig.send(headers))
        assert reply.value == region
        headers_out = trace.headers()
        assert headers_out["x-edge-region"] == region and headers_out["x-edge-colo"] == colo
        assert headers_out["x-edge-route-reason"] == "nearest"
    assert rig.handles["ap"].calls == ["complete"]  # nothing woken


def test_cold_nearest_is_detoured_to_a_warm_region_and_really_woken() -> None:
    rig = Rig({"eu": 1, "us": 0, "ap": 0})

    async def go():
        result = await rig.send(TOKYO)
        await asyncio.sleep(0)  # let the wake task send its call
        assert rig.pool_top_ups == 0
        await asyncio.sleep(0.01)  # and have it answered: ap's replica took a warm worker
        return result

    reply, trace = asyncio.run(go())
    assert reply.value == "eu" and trace.reason == "warm"
    assert rig.handles["ap"].calls == ["wake"]  # a real call that queues until a replica runs
    assert rig.pool_top_ups == 1
    assert trace.rtt_ms > 100  # the detour's extra RTT is acted out and reported


def test_back_pressure_spills_to_the_next_region_and_is_not_a_failure() -> None:
    rig = Rig(ALL_WARM)
    rig.handles["ap"].behaviour = lambda method: _raise(QueueFullError("full"))
    reply, trace = asyncio.run(rig.send(TOKYO))
    assert reply.value != "ap" and trace.reason == "spillover"
    assert [o.kind for o in rig.reported] == ["saturated", "ok"]
    assert rig.pools.pools(MODEL)["ap"].saturated  # the next request skips it at once
    _, trace = asyncio.run(rig.send(TOKYO))
    assert trace.reason == "spillover" and rig.handles["ap"].calls == ["complete"]
    assert trace.failed_regions == ()  # back-pressure is not a failure


def test_every_region_full_is_a_503_with_retry_after_and_no_failure() -> None:
    rig = Rig(ALL_WARM)
    for handle in rig.handles.values():
        handle.behaviour = lambda method: _raise(QueueFullError("full", retry_after_s=1))
    with pytest.raises(QueueFullError) as caught:
        asyncio.run(rig.send(TOKYO))
    assert caught.value.status == 503 and caught.value.retry_after_s == 1
    assert {o.kind for o in rig.reported} == {"saturated"}


def test_a_replica_error_fails_over_and_counts_against_that_region() -> None:
    rig = Rig(ALL_WARM)
    rig.handles["ap"].behaviour = lambda method: _raise(RegionFaultError("down"))
    reply, trace = asyncio.run(rig.send(TOKYO))
    assert reply.value != "ap" and trace.reason == "failover"
    assert trace.headers()["x-edge-failover"].startswith("ap,")
    assert rig.reported[0] == Outcome(MODEL, "ap", "failed")
    assert (trace.failed_regions, trace.skipped_colos) == (("ap",), ())  # what metrics count


def test_a_dead_actor_is_mapped_and_failed_over() -> None:
    from ray.exceptions import ActorDiedError

    rig = Rig(ALL_WARM)
    rig.handles["ap"].behaviour = lambda method: _raise(ActorDiedError())
    reply, _ = asyncio.run(rig.send(TOKYO))
    assert reply.value != "ap"
    assert rig.reported[0].kind == "failed"


def test_a_client_error_is_not_failed_over_nor_counted() -> None:
    rig = Rig(ALL_WARM)
    rig.handles["ap"].behaviour = lambda method: _raise(InvalidRequestError("bad"))
    with pytest.raises(InvalidRequestError):
        asyncio.run(rig.send(TOKYO))
    assert rig.reported == [] and rig.handles["eu"].calls == []


def test_a_hung_region_gets_its_share_of_the_deadline_then_the_next_answers() -> None:
    rig = Rig(ALL_WARM)
    rig.handles["ap"].behaviour = lambda method: asyncio.sleep(60)
    started = time.monotonic()
    reply, trace = asyncio.run(rig.send(TOKYO, deadline_s=0.6))
    assert reply.value != "ap" and trace.reason == "failover"
    assert time.monotonic() - started < 0.6
    assert rig.reported[0] == Outcome(MODEL, "ap", "failed")


def test_every_region_failing_is_the_last_error() -> None:
    rig = Rig(ALL_WARM)
    for handle in rig.handles.values():
        handle.behaviour = lambda method: _raise(RegionFaultError("down"))
    with pytest.raises(OverloadedError):
        asyncio.run(rig.send(TOKYO))
    assert [o.kind for o in rig.reported] == ["failed"] * 3


def test_a_cold_start_is_measured_and_reported() -> None:
    rig = Rig({})  # all cold: the nearest region serves and waits for its replica
    rig.handles["ap"].behaviour = lambda method: _ok("ap", ready_at=time.time() + 1.5)
    _, trace = asyncio.run(rig.send(TOKYO))
    assert trace.region == "ap" and trace.reason == "nearest"
    assert trace.cold_start_ms is not None and trace.cold_start_ms > 1000
    assert trace.headers()["x-edge-cold-start"] == "1"
    assert rig.reported[0].cold_start_ms == trace.cold_start_ms
    assert rig.pools.last_cold_start[MODEL]["wait_ms"] == trace.cold_start_ms
    assert rig.pool_top_ups == 1
    rig.handles["ap"].behaviour = lambda method: _ok("ap", ready_at=time.time() - 1.0)
    asyncio.run(rig.send(TOKYO))  # its replica was ready before the request: warm, no top-up
    assert rig.pool_top_ups == 1


def test_a_cache_hit_is_answered_by_the_entry_colo_for_its_home_region() -> None:
    rig = Rig(ALL_WARM)
    trace = asyncio.run(rig.dispatcher.nearest(MODEL, TOKYO, None))
    assert (trace.colo, trace.region) == ("NRT", "ap")
    assert all(not handle.calls for handle in rig.handles.values())


def test_an_attempt_whose_region_loses_its_replicas_fails_over_at_once() -> None:
    """A killed node: Serve holds the request for a replica that cannot be placed; once the
    shared state shows the region without replicas, the request moves on."""
    rig = Rig(ALL_WARM)
    rig.handles["ap"].behaviour = lambda method: asyncio.sleep(60)

    async def go():
        sending = asyncio.ensure_future(rig.send(TOKYO, deadline_s=30.0))
        await asyncio.sleep(0.3)
        rig.pools.snapshot = BoardSnapshot({MODEL: {"eu": WARM, "us": WARM}}, {})  # ap: gone
        return await sending

    started = time.monotonic()
    reply, trace = asyncio.run(go())
    assert reply.value != "ap" and trace.reason == "failover"
    assert time.monotonic() - started < 2.0  # not the 10 s share of the deadline
    assert rig.reported[0] == Outcome(MODEL, "ap", "failed")


def test_a_cold_region_waiting_for_its_first_replica_is_not_lost() -> None:
    rig = Rig({})  # all cold: the request waits on the nearest region's cold start

    async def slow_start(method: str) -> Reply[str]:
        await asyncio.sleep(0.6)
        return await _ok("ap")

    rig.handles["ap"].behaviour = slow_start
    reply, trace = asyncio.run(rig.send(TOKYO))
    assert reply.value == "ap" and trace.reason == "nearest"


def test_a_colo_drilled_to_fail_passes_the_request_to_the_next_colo() -> None:
    from edge_sim.faults import ColoFault

    rig = Rig(ALL_WARM)
    rig.dispatcher.network.set_fault("NRT", ColoFault(error_rate=1.0))
    reply, trace = asyncio.run(rig.send(TOKYO))
    assert trace.colo != "NRT" and trace.reason == "failover"
    assert trace.headers()["x-edge-failover"].startswith("NRT,")
    assert rig.reported == [Outcome(MODEL, trace.region, "ok")]  # no region blamed
    assert (trace.skipped_colos, trace.failed_regions) == (("NRT",), ())


def test_with_one_region_a_failed_attempt_is_retried_there() -> None:
    """Without `regions` there is one pool per model: a retry goes to it again (Serve picks
    another replica, or the one that replaced a dead one)."""
    config = EdgeConfig.from_mapping({"latency": {"real_delay_scale": 0}})
    handle = FakeRegion("default")
    calls = {"n": 0}

    def first_fails(method: str) -> Any:
        calls["n"] += 1
        return _raise(RegionFaultError("dead replica")) if calls["n"] == 1 else _ok("default")

    handle.behaviour = first_fails
    pools = RegionPools({MODEL: {"default": handle}}, config.region_policy, 3000.0)
    dispatcher: EdgeDispatcher[Reply[str]] = EdgeDispatcher(
        EdgeNetwork(config, centroids=CountryCentroids({})), config.region_map(), pools, 3
    )
    reply, trace = asyncio.run(
        dispatcher.dispatch(
            MODEL, TOKYO, None, lambda h: h.complete.remote(), lambda r: r, deadline_s=5.0
        )
    )
    assert reply.value == "default" and trace.reason == "failover"
    assert trace.headers()["x-edge-failover"] == "default,default"
