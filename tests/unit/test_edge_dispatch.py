"""EdgeDispatcher with fake region handles: where a request is served, what wakes, what spills,
what fails over, and what the shared state is told (no Ray). Time is a manual clock: a test moves
it past a deadline or a loss check instead of sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from deployments.config import FairQueueConfig
from deployments.contracts.chat_deployment import ChatClient, ChatRequest
from deployments.contracts.edge_control_deployment import EdgeControlClient
from deployments.contracts.replies import Reply
from deployments.contracts.sampling_params import SamplingParams
from deployments.contracts.warm_pool_deployment import WarmPoolClient
from deployments.errors import (
    BusyError,
    InvalidRequestError,
    OverloadedError,
    QueueFullError,
    RegionFaultError,
    WaitBudgetExceededError,
)
from deployments.ingress.edge.calls import AnyCall, CallResult, ModelCall, StreamCall
from deployments.ingress.edge.clock import ManualEdgeClock
from deployments.ingress.edge.dispatch import LOST_CHECK_S, EdgeDispatcher
from deployments.ingress.edge.fair_queue import FairGates
from deployments.ingress.edge.pools import RegionPools
from deployments.ingress.edge.trace import EdgeTrace
from deployments.ingress.edge.waiting import BACKGROUND, ColdStartNotice, WaitLimits
from deployments.observability import RequestTelemetry
from deployments.pacing import PollPacer
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
REQUEST = ChatRequest([{"role": "user", "content": "hi"}], SamplingParams())
COMPLETE = ModelCall(ChatClient.complete_choices, REQUEST)


@dataclass(frozen=True)
class Origin:
    """The request's scope as the dispatcher reads it off a RequestContext (an EdgeRequest):
    where its client is, how long it may wait, its telemetry and its cold-start notice."""

    location_headers: dict[str, str] = field(default_factory=dict)
    client_ip: str | None = None
    wait_limits: WaitLimits = field(default_factory=WaitLimits)
    telemetry: RequestTelemetry = field(default_factory=RequestTelemetry.disabled)
    warming: ColdStartNotice = field(default_factory=ColdStartNotice)
    key_id: str = "anonymous"
    key_weight: float = 1.0


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
        self.options_asked: list[dict[str, Any]] = []  # handle.options(...) made of this one
        # A wake answers with its replica's ready_at: one up since long before (no cold start)
        self.behaviour: Callable[[str], Any] = lambda method: (
            _ready_at(0.0) if method == "wake" else _ok(name)
        )

    def options(self, **options: Any) -> FakeRegion:
        self.options_asked.append(options)
        return self

    def __getattr__(self, method: str) -> FakeMethod:
        return FakeMethod(self, method)


class FakeStream:
    """A DeploymentResponseGenerator: `first` replies (or raises `error`), then ends."""

    def __init__(self, first: str, error: Exception | None = None):
        self.first, self.error = first, error
        self.cancelled = False

    async def __anext__(self) -> Reply[str]:
        if self.error is not None:
            raise self.error
        return await _ok(self.first)

    def cancel(self) -> None:
        self.cancelled = True


async def _ok(region: str, ready_at: float = 0.0) -> Reply[str]:
    return Reply(region, replica_ready_at=ready_at, replica_load_s=0.1)


async def _ready_at(ready_at: float) -> float:
    return ready_at


async def _raise(error: BaseException) -> Any:
    raise error


async def _hang(method: str) -> Any:
    await asyncio.Event().wait()  # a region that never answers


async def turns_until(condition: Callable[[], Any], turns: int = 100) -> None:
    """Let the event loop run until `condition` holds (a bounded number of turns, no time)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def let_run(turns: int = 20) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


class Rig:
    def __init__(
        self,
        running: dict[str, int],
        max_attempts: int = 3,
        deadline_s: float = 5.0,
        control: Any = None,
        busy_probe_s: float = 0.0,  # rejectIfBusy refuses at once unless a wake answered already
        attempt_timeout_s: float | None = None,
        real_delay_scale: float = 0.0,  # 1: the simulated RTTs slept on the manual clock
    ):
        latency = {"real_delay_scale": real_delay_scale}
        config = EdgeConfig.from_mapping({"regions": REGIONS, "latency": latency})
        self.clock = ManualEdgeClock()
        self.handles = {region: FakeRegion(region) for region in REGIONS}
        self.pool_top_ups = 0  # the warm pool asked to replace a worker a cold start took
        self.topped_up = asyncio.Event()
        self.pools = RegionPools(
            {MODEL: {region: ChatClient(handle) for region, handle in self.handles.items()}},
            config.region_policy,
            default_cold_start_ms=3000.0,
            control=EdgeControlClient(control) if control is not None else None,
            clock=self.clock,
            # the warm pool's client on a handle whose `top_up.remote()` counts the ask
            warm_pool=WarmPoolClient(
                SimpleNamespace(top_up=SimpleNamespace(remote=self._top_up_pool))
            ),
        )
        self.pools.snapshot = BoardSnapshot(
            {MODEL: {r: PoolView(running=n) for r, n in running.items()}}, {}
        )
        network = EdgeNetwork(config, centroids=CountryCentroids({}))
        self.dispatcher = EdgeDispatcher(
            network,
            config.region_map(),
            self.pools,
            max_attempts=max_attempts,
            deadline_s=deadline_s,
            clock=self.clock,
            busy_probe_s=busy_probe_s,
            attempt_timeouts_s={MODEL: attempt_timeout_s} if attempt_timeout_s else None,
        )
        self.reported: list[Outcome] = []
        original = self.pools.report

        def report(model: str, region: str, kind: Any, cold_ms: float | None = None) -> None:
            self.reported.append(Outcome(model, region, kind, cold_ms))
            original(model, region, kind, cold_ms)

        self.pools.report = report  # type: ignore[method-assign]

    def _top_up_pool(self) -> None:
        self.pool_top_ups += 1
        self.topped_up.set()

    async def send(
        self,
        headers: dict[str, str],
        call: AnyCall = COMPLETE,
        limits: WaitLimits | None = None,
        notice: ColdStartNotice | None = None,
    ) -> tuple[CallResult, EdgeTrace]:
        origin = Origin(
            headers, wait_limits=limits or WaitLimits(), warming=notice or ColdStartNotice()
        )
        return await self.dispatcher.dispatch(MODEL, origin, call)


ALL_WARM = {"eu": 1, "us": 1, "ap": 1}
WARM = PoolView(running=1)


def test_all_warm_serves_from_the_nearest_region_and_says_so() -> None:
    rig = Rig(ALL_WARM)
    for headers, region, colo in ((TOKYO, "ap", "NRT"), (FRANKFURT, "eu", "FRA")):
        result, trace = asyncio.run(rig.send(headers))
        assert result.reply.value == region and result.rest is None
        headers_out = trace.headers()
        assert headers_out["x-edge-region"] == region and headers_out["x-edge-colo"] == colo
        assert headers_out["x-edge-route-reason"] == "nearest"
    assert rig.handles["ap"].calls == ["complete_choices"]  # nothing woken


def test_cold_nearest_is_detoured_to_a_warm_region_and_really_woken() -> None:
    rig = Rig({"eu": 1, "us": 0, "ap": 0})

    async def go() -> tuple[CallResult, EdgeTrace]:
        result = await rig.send(TOKYO)
        await asyncio.sleep(0)  # let the wake task send its call
        assert rig.pool_top_ups == 0
        await asyncio.wait_for(rig.topped_up.wait(), 5)  # answered: ap's replica took a worker
        return result

    result, trace = asyncio.run(go())
    assert result.reply.value == "eu" and trace.reason == "warm"
    assert rig.handles["ap"].calls == ["wake"]  # a real call that queues until a replica runs
    assert rig.pool_top_ups == 1
    assert trace.rtt_ms > 100  # the detour's extra RTT is acted out and reported


def test_back_pressure_spills_to_the_next_region_and_is_not_a_failure() -> None:
    rig = Rig(ALL_WARM)
    rig.handles["ap"].behaviour = lambda method: _raise(QueueFullError("full"))
    result, trace = asyncio.run(rig.send(TOKYO))
    assert result.reply.value != "ap" and trace.reason == "spillover"
    assert [o.kind for o in rig.reported] == ["saturated", "ok"]
    assert rig.pools.pools(MODEL)["ap"].saturated  # the next request skips it at once
    _, trace = asyncio.run(rig.send(TOKYO))
    assert trace.reason == "spillover" and rig.handles["ap"].calls == ["complete_choices"]
    assert trace.failed_regions == ()  # back-pressure is not a failure


def test_a_full_region_is_skipped_for_the_policy_s_hold_then_tried_again() -> None:
    rig = Rig(ALL_WARM)
    rig.handles["ap"].behaviour = lambda method: _raise(QueueFullError("full"))
    asyncio.run(rig.send(TOKYO))
    rig.clock.advance(rig.pools.policy.saturation_hold_s)
    assert not rig.pools.pools(MODEL)["ap"].saturated
    rig.handles["ap"].behaviour = lambda method: _ok("ap")
    result, trace = asyncio.run(rig.send(TOKYO))
    assert result.reply.value == "ap" and trace.reason == "nearest"


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
    result, trace = asyncio.run(rig.send(TOKYO))
    assert result.reply.value != "ap" and trace.reason == "failover"
    assert trace.headers()["x-edge-failover"].startswith("ap,")
    assert rig.reported[0] == Outcome(MODEL, "ap", "failed")
    assert (trace.failed_regions, trace.skipped_colos) == (("ap",), ())  # what metrics count


def test_a_dead_actor_is_mapped_and_failed_over() -> None:
    from ray.exceptions import ActorDiedError

    rig = Rig(ALL_WARM)
    rig.handles["ap"].behaviour = lambda method: _raise(ActorDiedError())
    result, _ = asyncio.run(rig.send(TOKYO))
    assert result.reply.value != "ap"
    assert rig.reported[0].kind == "failed"


def test_a_client_error_is_not_failed_over_nor_counted() -> None:
    rig = Rig(ALL_WARM)
    rig.handles["ap"].behaviour = lambda method: _raise(InvalidRequestError("bad"))
    with pytest.raises(InvalidRequestError):
        asyncio.run(rig.send(TOKYO))
    assert rig.reported == [] and rig.handles["eu"].calls == []


def test_a_hung_region_gets_its_share_of_the_deadline_then_the_next_answers() -> None:
    rig = Rig(ALL_WARM, deadline_s=0.6)  # three attempts: 0.2 s each while none answers
    # still waiting on ap within its share; past it, well before the deadline, the next answers
    result, trace = asyncio.run(failed_over_from_hung_ap(rig, within_s=0.15, past_s=0.1))
    assert result.reply.value != "ap" and trace.reason == "failover"
    assert rig.reported[0] == Outcome(MODEL, "ap", "failed")


def test_a_warm_region_stuck_past_the_model_s_attempt_timeout_fails_over_then() -> None:
    """A reply lost with a dying node: the attempt ends at the model's per-try limit (here 1 s),
    not at its 10 s share of the deadline, and counts against the region."""
    rig = Rig(ALL_WARM, deadline_s=30.0, attempt_timeout_s=1.0)
    result, trace = asyncio.run(failed_over_from_hung_ap(rig, within_s=0.9, past_s=0.2))
    assert result.reply.value != "ap" and trace.reason == "failover"
    assert rig.reported[0] == Outcome(MODEL, "ap", "failed")
    assert rig.clock.now() == pytest.approx(1.1)


async def failed_over_from_hung_ap(
    rig: Rig, within_s: float, past_s: float
) -> tuple[CallResult, EdgeTrace]:
    """A Tokyo request on an ap that never answers: still waiting `within_s` in, answered by
    another region once the clock moved `past_s` more."""
    return await answered_after_a_wait(rig, _hang, within_s, lambda: rig.clock.advance(past_s))


async def answered_after_a_wait(
    rig: Rig, behaviour: Callable[[str], Any], waited_s: float, then: Callable[[], None]
) -> tuple[CallResult, EdgeTrace]:
    """A Tokyo request whose call to ap behaves as `behaviour`: still waiting `waited_s` in;
    after `then()`, its answer."""
    rig.handles["ap"].behaviour = behaviour
    sending = asyncio.ensure_future(rig.send(TOKYO))
    await turns_until(lambda: rig.handles["ap"].calls)
    rig.clock.advance(waited_s)
    await let_run()
    assert not sending.done()
    then()
    return await asyncio.wait_for(sending, 5)


def test_a_cold_region_is_given_its_share_not_the_attempt_timeout() -> None:
    rig = Rig({}, deadline_s=30.0, attempt_timeout_s=1.0)  # all cold: ap's replica is starting
    # five times the per-try limit: the cold start may take that
    result, trace = asyncio.run(served_after_a_cold_start(rig, waited_s=5.0))
    assert result.reply.value == "ap" and trace.reason == "nearest"


def test_every_region_failing_is_the_last_error() -> None:
    rig = Rig(ALL_WARM)
    for handle in rig.handles.values():
        handle.behaviour = lambda method: _raise(RegionFaultError("down"))
    with pytest.raises(OverloadedError):
        asyncio.run(rig.send(TOKYO))
    assert [o.kind for o in rig.reported] == ["failed"] * 3


def test_a_cold_start_is_measured_and_reported() -> None:
    rig = Rig({})  # all cold: the nearest region serves and waits for its replica
    rig.handles["ap"].behaviour = lambda method: _ok("ap", ready_at=rig.clock.unix() + 1.5)
    _, trace = asyncio.run(rig.send(TOKYO))
    assert trace.region == "ap" and trace.reason == "nearest"
    assert trace.cold_start_ms == pytest.approx(1500.0)
    assert trace.headers()["x-edge-cold-start"] == "1"
    assert rig.reported[0].cold_start_ms == trace.cold_start_ms
    record = rig.pools.last_cold_start[MODEL]
    assert record["wait_ms"] == trace.cold_start_ms and record["at_unix"] == rig.clock.unix()
    assert rig.pool_top_ups == 1
    rig.handles["ap"].behaviour = lambda method: _ok("ap", ready_at=rig.clock.unix() - 1.0)
    asyncio.run(rig.send(TOKYO))  # its replica was ready before the request: warm, no top-up
    assert rig.pool_top_ups == 1


def test_a_cache_hit_is_answered_by_the_entry_colo_for_its_home_region() -> None:
    rig = Rig(ALL_WARM)
    trace = asyncio.run(rig.dispatcher.nearest(MODEL, Origin(TOKYO)))
    assert (trace.colo, trace.region, trace.cache) == ("NRT", "ap", "HIT")
    assert all(not handle.calls for handle in rig.handles.values())


def test_a_hit_waits_its_rtt_and_one_that_waited_for_the_answer_only_what_is_left_of_it() -> None:
    rig = Rig(ALL_WARM, real_delay_scale=1.0)
    rtt_s = rig.dispatcher.plan(MODEL, Origin(TOKYO))[0].rtt_ms / 1000

    async def go() -> None:
        found = asyncio.ensure_future(rig.dispatcher.nearest(MODEL, Origin(TOKYO)))
        joined = asyncio.ensure_future(
            rig.dispatcher.nearest(MODEL, Origin(TOKYO), waited_s=rtt_s / 2)
        )
        waited_out = asyncio.ensure_future(
            rig.dispatcher.nearest(MODEL, Origin(TOKYO), waited_s=rtt_s)
        )
        await let_run()
        assert waited_out.done() and not joined.done() and not found.done()
        rig.clock.advance(rtt_s / 2 + 1e-6)
        await let_run()
        assert joined.done() and not found.done()
        rig.clock.advance(rtt_s / 2)
        await let_run()
        assert found.done()
        assert {t.result().cache for t in (found, joined, waited_out)} == {"HIT"}

    assert rtt_s > 0
    asyncio.run(go())


def test_an_attempt_whose_region_loses_its_replicas_fails_over_at_its_next_look() -> None:
    """A killed node: Serve holds the request for a replica that cannot be placed; once the
    shared state shows the region without replicas, the request moves on."""
    rig = Rig(ALL_WARM, deadline_s=30.0)  # ap's share: 10 s
    rig.handles["ap"].behaviour = _hang

    async def go() -> tuple[CallResult, EdgeTrace]:
        sending = asyncio.ensure_future(rig.send(TOKYO))
        await turns_until(lambda: rig.handles["ap"].calls)
        rig.clock.advance(LOST_CHECK_S)  # a look: ap still there
        await let_run()
        assert not sending.done()
        rig.pools.snapshot = BoardSnapshot({MODEL: {"eu": WARM, "us": WARM}}, {})  # ap: gone
        rig.clock.advance(LOST_CHECK_S)  # the next look sees it
        return await asyncio.wait_for(sending, 5)

    result, trace = asyncio.run(go())
    assert result.reply.value != "ap" and trace.reason == "failover"
    assert rig.reported[0] == Outcome(MODEL, "ap", "failed")
    assert rig.clock.now() == pytest.approx(2 * LOST_CHECK_S)  # not the 10 s share


def test_a_region_scaled_to_zero_under_an_old_snapshot_is_waited_on_not_left_for_a_cold_one() -> (
    None
):
    """The snapshot said ap was warm; Serve had scaled it to zero (idle). The request queued
    there wakes it: the attempt waits for that replica rather than waking a farther cold region
    too (two cold starts, the request on the later one)."""
    rig = Rig({"ap": 1}, deadline_s=60.0)  # eu and us cold; ap's share: 20 s
    notice = ColdStartNotice()

    async def go() -> tuple[CallResult, EdgeTrace]:
        replica_ready = asyncio.Event()

        async def cold_start(method: str) -> Reply[str]:
            await replica_ready.wait()
            return await _ok("ap")

        rig.handles["ap"].behaviour = cold_start
        sending = asyncio.ensure_future(rig.send(TOKYO, notice=notice))
        await turns_until(lambda: rig.handles["ap"].calls)
        assert notice.region is None  # warm, as far as the router knows
        rig.pools.snapshot = BoardSnapshot({MODEL: {}}, {})  # the next sync: ap at zero
        for _ in range(8):  # 2 s of looks, within 2 expected cold starts (3 s each)
            rig.clock.advance(LOST_CHECK_S)
            await let_run()
        assert not sending.done()
        assert notice.region == "ap"  # a stream says it waits for a cold start
        replica_ready.set()
        return await asyncio.wait_for(sending, 5)

    result, trace = asyncio.run(go())
    assert result.reply.value == "ap" and trace.failed_regions == ()
    assert not rig.handles["eu"].calls and not rig.handles["us"].calls


def test_a_region_gone_cold_under_an_attempt_is_left_once_it_outstays_two_cold_starts() -> None:
    rig = Rig({"ap": 1}, deadline_s=60.0)  # ap's share: 20 s
    rig.handles["ap"].behaviour = _hang  # a dead node's: the replica is never placed

    async def go() -> tuple[CallResult, EdgeTrace]:
        sending = asyncio.ensure_future(rig.send(TOKYO))
        await turns_until(lambda: rig.handles["ap"].calls)
        rig.pools.snapshot = BoardSnapshot({MODEL: {}}, {})
        while not sending.done() and rig.clock.now() < 20:
            rig.clock.advance(LOST_CHECK_S)
            await let_run()
        return await asyncio.wait_for(sending, 5)

    result, trace = asyncio.run(go())
    assert trace.failed_regions == ("ap",) and result.reply.value != "ap"
    # Seen cold at the first look (0.25 s), left at the first look past 2 x 3 s after it.
    assert rig.clock.now() == pytest.approx(LOST_CHECK_S + 2 * 3.0 + LOST_CHECK_S)


def test_a_cold_region_waiting_for_its_first_replica_is_not_lost() -> None:
    rig = Rig({})  # all cold: the request waits on the nearest region's cold start
    # four looks at a region with no replica yet
    result, trace = asyncio.run(served_after_a_cold_start(rig, waited_s=4 * LOST_CHECK_S))
    assert result.reply.value == "ap" and trace.reason == "nearest"


async def served_after_a_cold_start(rig: Rig, waited_s: float) -> tuple[CallResult, EdgeTrace]:
    """A Tokyo request waiting on ap's replica to start: still waiting `waited_s` later, then
    answered once the replica is ready."""
    replica_ready = asyncio.Event()

    async def cold_start(method: str) -> Reply[str]:
        await replica_ready.wait()
        return await _ok("ap")

    return await answered_after_a_wait(rig, cold_start, waited_s, replica_ready.set)


def test_a_colo_drilled_to_fail_passes_the_request_to_the_next_colo() -> None:
    from edge_sim.faults import ColoFault

    rig = Rig(ALL_WARM)
    rig.dispatcher.network.set_fault("NRT", ColoFault(error_rate=1.0))
    _, trace = asyncio.run(rig.send(TOKYO))
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
    pools = RegionPools({MODEL: {"default": ChatClient(handle)}}, config.region_policy, 3000.0)
    dispatcher = EdgeDispatcher(
        EdgeNetwork(config, centroids=CountryCentroids({})),
        config.region_map(),
        pools,
        max_attempts=3,
        deadline_s=5.0,
    )
    result, trace = asyncio.run(dispatcher.dispatch(MODEL, Origin(TOKYO), COMPLETE))
    assert result.reply.value == "default" and trace.reason == "failover"
    assert trace.headers()["x-edge-failover"] == "default,default"


# ---- streams ------------------------------------------------------------------------------------

STREAM = StreamCall(ChatClient.stream, REQUEST)


def test_a_stream_runs_on_the_region_s_streaming_handle_made_once() -> None:
    rig = Rig(ALL_WARM)
    streams = []

    def opens(method: str) -> FakeStream:
        streams.append(FakeStream("first chunk"))
        return streams[-1]

    rig.handles["ap"].behaviour = opens
    for _ in range(3):
        result, trace = asyncio.run(rig.send(TOKYO, STREAM))
        assert result.reply.value == "first chunk" and result.rest is streams[-1]
        assert trace.region == "ap"
    assert rig.handles["ap"].options_asked == [{"stream": True}]  # cached, not one per request
    result.close()
    assert streams[-1].cancelled and not streams[0].cancelled


def test_a_stream_failing_before_its_first_reply_is_cancelled_and_failed_over() -> None:
    rig = Rig(ALL_WARM)
    broken = FakeStream("never", error=RegionFaultError("down"))
    rig.handles["ap"].behaviour = lambda method: broken
    rig.handles["eu"].behaviour = lambda method: FakeStream("from eu")
    result, trace = asyncio.run(rig.send(TOKYO, STREAM))
    assert broken.cancelled  # its slot freed
    assert result.reply.value == "from eu" and trace.reason == "failover"
    assert rig.reported[0] == Outcome(MODEL, "ap", "failed")


def test_a_gated_model_holds_a_stream_s_slot_until_it_is_closed_and_a_unary_s_until_it_answers():
    async def scenario() -> None:
        rig = Rig({"eu": 1})  # one replica: the gate lets one request in at a time
        gates = FairGates(FairQueueConfig(in_flight_per_replica=1), [MODEL], rig.pools.pools)
        rig.dispatcher.gate = gates
        queue = gates.queues[MODEL]
        rig.handles["eu"].behaviour = lambda method: FakeStream("chunk")
        opened, _ = await rig.send(FRANKFURT, STREAM)
        assert queue.in_flight == 1
        rig.handles["eu"].behaviour = lambda method: _ok("eu")
        waiting = asyncio.ensure_future(rig.send(FRANKFURT))
        await let_run()
        assert not waiting.done() and queue.waiting == 1
        opened.close()  # the stream ends: the next request goes out
        _, trace = await waiting
        assert trace.region == "eu" and (queue.in_flight, queue.waiting) == (0, 0)

    asyncio.run(scenario())


def test_a_gated_request_that_fails_gives_its_slot_back() -> None:
    async def scenario() -> None:
        rig = Rig({"eu": 1}, max_attempts=1)
        gates = FairGates(FairQueueConfig(in_flight_per_replica=1), [MODEL], rig.pools.pools)
        rig.dispatcher.gate = gates
        rig.handles["eu"].behaviour = lambda method: _raise(InvalidRequestError("bad"))
        with pytest.raises(InvalidRequestError):
            await rig.send(FRANKFURT)
        assert gates.queues[MODEL].in_flight == 0

    asyncio.run(scenario())


# ---- the manual clock ---------------------------------------------------------------------------


def test_the_manual_clock_fires_due_timers_in_order_each_at_its_time() -> None:
    clock = ManualEdgeClock(unix_start_s=1000.0)
    fired: list[tuple[str, float]] = []

    def note(name: str) -> Callable[[], None]:
        return lambda: fired.append((name, clock.now()))

    def chain() -> None:
        clock.call_later(0.5, note("chained"))

    clock.call_later(2.0, note("late"))
    clock.call_later(1.0, chain)
    clock.call_later(1.5, note("cancelled")).cancel()
    clock.advance(1.9)
    assert fired == [("chained", 1.5)]
    clock.advance(0.1)
    assert fired == [("chained", 1.5), ("late", 2.0)]
    assert (clock.now(), clock.unix()) == (2.0, 1002.0)
    with pytest.raises(ValueError):
        clock.advance(-1)


# ---- wait limits: rejectIfBusy, x-edge-max-wait-ms, the cold-start notice ----------------------

REJECT_IF_BUSY = WaitLimits(reject_if_busy=True)


def test_reject_if_busy_is_served_by_a_free_warm_region_without_waiting() -> None:
    rig = Rig({"eu": 1, "us": 0, "ap": 0})  # Tokyo's nearest, ap, is cold
    result, trace = asyncio.run(rig.send(TOKYO, limits=REJECT_IF_BUSY))
    assert result.reply.value == "eu"
    assert rig.handles["ap"].calls == ["wake"]  # woken for later, not waited on


def test_reject_if_busy_with_no_free_region_is_a_429_at_once_with_the_expected_wake_up() -> None:
    rig = Rig({})  # all cold: the default cold-start estimate, 3 s
    with pytest.raises(BusyError) as caught:
        asyncio.run(rig.send(TOKYO, limits=REJECT_IF_BUSY))
    assert caught.value.status == 429 and caught.value.code == "capacity_exceeded"
    assert caught.value.message == "Capacity temporarily exceeded, please try again."
    # 3 s (the shared mean) and a quarter: no cold start measured here yet
    assert caught.value.response_headers() == {"retry-after": "4", "retry-after-ms": "3750"}
    assert all(handle.calls in ([], ["wake"]) for handle in rig.handles.values())
    # Without the option the same request waits for the cold start instead.
    rig.handles["ap"].behaviour = lambda method: _ok("ap", ready_at=rig.clock.unix() + 1)
    assert asyncio.run(rig.send(TOKYO))[0].reply.value == "ap"


def test_reject_if_busy_when_every_free_region_pushes_back_is_a_429_not_a_503() -> None:
    rig = Rig(ALL_WARM)
    for handle in rig.handles.values():
        handle.behaviour = lambda method: _raise(QueueFullError("full", retry_after_s=2))
    with pytest.raises(BusyError) as caught:
        asyncio.run(rig.send(TOKYO, limits=REJECT_IF_BUSY))
    assert caught.value.retry_after_s == 2
    assert {o.kind for o in rig.reported} == {"saturated"}


def test_a_retry_at_retry_after_ms_after_a_cold_start_refusal_is_served() -> None:
    rig = Rig({}, busy_probe_s=0.2)  # all cold; ap's replica comes up 3 s after its wake

    async def go() -> tuple[float, CallResult, EdgeTrace]:
        up = asyncio.Event()

        async def wake() -> float:
            await up.wait()
            return rig.clock.unix()  # the replica became ready now: a cold start

        rig.handles["ap"].behaviour = lambda method: wake() if method == "wake" else _ok("ap")
        refusing = asyncio.ensure_future(rig.send(TOKYO, limits=REJECT_IF_BUSY))
        await turns_until(lambda: rig.handles["ap"].calls)
        rig.clock.advance(0.2)  # the wake has its probe's time to answer, and does not
        with pytest.raises(BusyError) as refused:
            await refusing
        retry_s = int(refused.value.response_headers()["retry-after-ms"]) / 1000
        rig.clock.advance(2.8)
        up.set()
        await turns_until(lambda: rig.pools.pools(MODEL)["ap"].warm)
        rig.clock.advance(retry_s - 3.0)  # edge-control's snapshot still says ap is cold
        result, trace = await rig.send(TOKYO, limits=REJECT_IF_BUSY)
        return retry_s, result, trace

    retry_s, result, trace = asyncio.run(go())
    assert retry_s == pytest.approx(3.55)  # the 3.75 s estimate, less the probe's 0.2 s
    assert result.reply.value == "ap" and trace.region == "ap"
    assert rig.handles["ap"].calls[0] == "wake" and len(rig.handles["ap"].calls) == 2
    assert rig.pools.estimate.cold_start_s(MODEL, 3.0) == pytest.approx(3.75)  # 1 of 5 samples


def test_reject_if_busy_is_served_by_a_replica_another_router_woke() -> None:
    """This router's snapshot says cold, but a replica is up (an earlier refusal's wake, sent by
    another router): its wake answers within the probe, so the retry is served, not refused."""
    rig = Rig({}, busy_probe_s=0.2)
    result, trace = asyncio.run(rig.send(TOKYO, limits=REJECT_IF_BUSY))
    assert result.reply.value == "ap" and trace.cold_start_ms is None
    assert rig.handles["ap"].calls[0] == "wake"
    assert rig.pools.estimate.cold_start_s(MODEL, 3.0) == pytest.approx(3.75)  # none measured


def test_a_429_for_back_pressure_retries_when_the_pools_mark_ends() -> None:
    rig = Rig(ALL_WARM)
    for handle in rig.handles.values():
        handle.behaviour = lambda method: _raise(QueueFullError("full", retry_after_s=0.4))

    async def go() -> BusyError:
        with pytest.raises(BusyError):  # every pool pushes back: each is marked full for 1 s
            await rig.send(TOKYO, limits=REJECT_IF_BUSY)
        rig.clock.advance(0.25)
        with pytest.raises(BusyError) as second:  # refused before any call: the marks' rest
            await rig.send(TOKYO, limits=REJECT_IF_BUSY)
        return second.value

    assert asyncio.run(go()).retry_after_s == pytest.approx(0.75)


def test_a_background_call_is_served_by_a_warm_region_and_wakes_no_cold_one() -> None:
    rig = Rig({"eu": 1, "us": 0, "ap": 0})  # Tokyo's nearest, ap, is cold: the plan wakes it
    result, _ = asyncio.run(rig.send(TOKYO, limits=BACKGROUND))
    assert result.reply.value == "eu"
    assert rig.handles["ap"].calls == [] and rig.handles["us"].calls == []


def test_a_background_call_with_no_warm_region_is_busy_at_once_and_wakes_nothing() -> None:
    rig = Rig({})
    with pytest.raises(BusyError):
        asyncio.run(rig.send(TOKYO, limits=BACKGROUND))
    assert all(handle.calls == [] for handle in rig.handles.values())
    # The same with rejectIfBusy alone wakes the nearest region for a retry.
    with pytest.raises(BusyError):
        asyncio.run(rig.send(TOKYO, limits=REJECT_IF_BUSY))
    assert rig.handles["ap"].calls == ["wake"]


def test_a_wait_budget_shorter_than_the_expected_wake_up_is_a_503_at_once() -> None:
    rig = Rig({})  # cold everywhere; the cold-start estimate is 3 s
    rig.handles["ap"].behaviour = _hang  # its replica is still starting throughout
    budget = WaitLimits(max_wait_s=0.5)

    async def go() -> tuple[WaitBudgetExceededError, WaitBudgetExceededError]:
        with pytest.raises(WaitBudgetExceededError) as first:
            await rig.send(TOKYO, limits=budget)
        await turns_until(lambda: rig.handles["ap"].calls)
        # A second request 1 s later: the wake in flight has waited 1 s of the 3 s estimate.
        rig.clock.advance(1.0)
        with pytest.raises(WaitBudgetExceededError) as second:
            await rig.send(TOKYO, limits=budget)
        return first.value, second.value

    first, second = asyncio.run(go())
    assert first.status == 503 and first.response_headers() == {
        "retry-after": "4",
        "retry-after-ms": "3750",
    }
    assert second.retry_after_s == pytest.approx(2.75)
    assert rig.handles["ap"].calls == ["wake"]  # woken all the same (once): a retry finds it warm


def test_a_wait_budget_that_runs_out_mid_attempt_is_a_503_not_a_region_failure() -> None:
    rig = Rig(ALL_WARM, deadline_s=30.0)
    rig.handles["ap"].behaviour = _hang

    async def go() -> None:
        sending = asyncio.ensure_future(rig.send(TOKYO, limits=WaitLimits(max_wait_s=0.2)))
        await turns_until(lambda: rig.handles["ap"].calls)
        rig.clock.advance(0.25)
        await asyncio.wait_for(sending, 5)

    with pytest.raises(WaitBudgetExceededError) as caught:
        asyncio.run(go())
    # warm: no wake-up to wait
    assert caught.value.response_headers() == {"retry-after": "1", "retry-after-ms": "1"}
    assert rig.reported == [] and rig.handles["eu"].calls == []  # the client's budget, not ap's


def test_a_budget_longer_than_the_wake_up_waits_for_the_cold_start() -> None:
    rig = Rig({})
    rig.handles["ap"].behaviour = lambda method: _ok("ap", ready_at=rig.clock.unix() + 1)
    result, trace = asyncio.run(rig.send(TOKYO, limits=WaitLimits(max_wait_s=10.0)))
    assert result.reply.value == "ap" and trace.cold_start_ms == pytest.approx(1000.0)


def test_the_notice_hears_of_a_wait_for_a_cold_replica_and_only_of_that() -> None:
    rig = Rig({"eu": 1, "us": 0, "ap": 0})
    warm_notice, cold_notice = ColdStartNotice(), ColdStartNotice()
    asyncio.run(rig.send(FRANKFURT, notice=warm_notice))  # eu is warm
    assert warm_notice.region is None
    rig2 = Rig({})
    asyncio.run(rig2.send(TOKYO, notice=cold_notice))
    assert cold_notice.region == "ap"
    # with the estimate a refusal's Retry-After gives (3 s shared mean, and a quarter)
    assert cold_notice.describe() == "warming region=ap ready-in-ms=3750"


class RecordingControl:
    """Edge-control's handle as `RegionPools.sync` calls it: records each sync's arguments and
    answers `snapshot`; `fail` makes the next sync raise, as a restarting edge-control would."""

    def __init__(self, snapshot: BoardSnapshot) -> None:
        self.snapshot = snapshot
        self.synced: list[tuple[list[Outcome], dict[tuple[str, str], int]]] = []
        self.fail = False
        self.sync = self

    def remote(self, outcomes: list[Outcome], demand: dict[tuple[str, str], int]) -> Any:
        if self.fail:
            self.fail = False
            return _raise(RuntimeError("edge-control restarting"))
        self.synced.append((outcomes, dict(demand)))
        return self._answer()

    async def _answer(self) -> BoardSnapshot:
        return self.snapshot


def test_demand_is_counted_by_the_entry_colo_s_region_and_survives_a_failed_sync() -> None:
    running = {"eu": 1, "us": 0, "ap": 0}
    control = RecordingControl(
        BoardSnapshot({MODEL: {r: PoolView(running=n) for r, n in running.items()}}, {})
    )
    rig = Rig(running, control=control)

    async def go() -> None:
        for headers in (TOKYO, TOKYO, FRANKFURT):
            await rig.send(headers)  # Tokyo's requests detour to eu: their demand is still ap's
        control.fail = True
        with pytest.raises(RuntimeError):
            await rig.pools.sync()
        await rig.send(TOKYO)
        await rig.pools.sync()

    asyncio.run(go())
    demand: dict[tuple[str, str], int] = {}
    for _, synced in control.synced:
        for key, count in synced.items():
            demand[key] = demand.get(key, 0) + count
    assert demand == {(MODEL, "ap"): 3, (MODEL, "eu"): 1}  # none lost to the failed sync
    served = [o.region for outcomes, _ in control.synced for o in outcomes if o.kind == "ok"]
    assert served == ["eu"] * 4


class IdlePacer(PollPacer):
    """The pools' sync pace, reduced to its two states: `fast_s` after a sync with something to
    hand over or a changed snapshot, an hour after one without (only a request can end that
    wait); records each wait."""

    def __init__(self) -> None:
        super().__init__(fast_s=0.001, idle_s=3600.0)
        self.waits: list[float] = []

    def after_read(self, busy: bool) -> float:
        self.interval_s = self.fast_s if busy else self.idle_s
        self.waits.append(self.interval_s)
        return self.interval_s


def test_an_idle_router_syncs_rarely_and_its_next_request_syncs_at_once() -> None:
    running = {"eu": 1, "us": 0, "ap": 0}
    control = RecordingControl(
        BoardSnapshot({MODEL: {r: PoolView(running=n + 1) for r, n in running.items()}}, {})
    )  # not the rig's snapshot: the first sync changes the pools
    rig = Rig(running, control=control)
    pacer = rig.pools.sync_pacer = IdlePacer()

    async def until(condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(5):
            while not condition():
                await asyncio.sleep(0)

    async def go() -> None:
        await rig.pools.ready()  # starts syncing
        await until(lambda: len(pacer.waits) == 2)
        for _ in range(50):  # fifty turns of its loop
            await asyncio.sleep(0)
        assert pacer.waits == [0.001, 3600.0]  # the pools changed: fast; then nothing new: idle
        assert len(control.synced) == 2  # and no sync while all is still
        await rig.send(FRANKFURT)  # its demand ends the idle wait
        await until(lambda: len(control.synced) == 3)

    asyncio.run(go())
    assert rig.pools.snapshot == control.snapshot
    assert control.synced[2][1] == {(MODEL, "eu"): 1}  # the request's demand, at once


def test_an_attempt_waiting_on_a_region_keeps_the_syncs_coming() -> None:
    """So that a region lost meanwhile (a killed node: Serve holds the call) is seen within a
    sync or so, not after an idle router's longest wait."""
    running = {"eu": 1, "us": 1, "ap": 1}
    control = RecordingControl(
        BoardSnapshot({MODEL: {r: PoolView(running=n) for r, n in running.items()}}, {})
    )
    rig = Rig(running, control=control, deadline_s=60.0)
    pacer = rig.pools.sync_pacer = IdlePacer()
    rig.handles["ap"].behaviour = _hang

    async def until(condition: Callable[[], bool]) -> None:
        async with asyncio.timeout(5):
            while not condition():
                await asyncio.sleep(0)

    async def go() -> None:
        sending = asyncio.ensure_future(rig.send(TOKYO))
        await until(lambda: bool(rig.handles["ap"].calls))
        await until(lambda: pacer.waits[-1:] == [3600.0])  # demand handed over; then idle
        for _ in range(3):
            synced = len(control.synced)
            rig.clock.advance(LOST_CHECK_S)  # a look at ap, still there
            await until(lambda: len(control.synced) > synced)  # noqa: B023 - awaited here
            await until(lambda: pacer.waits[-1:] == [3600.0])
        sending.cancel()

    asyncio.run(go())
