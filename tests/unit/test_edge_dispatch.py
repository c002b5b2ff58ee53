"""EdgeDispatcher on a real EdgeNetwork: colo choice, failover, timeouts, cold starts, warmth."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from deployments.edge import EdgeDispatcher, EdgeTrace, InjectedFaultError, WarmthTracker
from deployments.errors import (
    BadHeaderValueError,
    ContextLengthExceededError,
    InternalServerError,
    InvalidRequestError,
    ModelNotFoundError,
    ModelNotReadyError,
    OverloadedError,
    ServingError,
)
from deployments.servers.base import Reply
from edge_sim.clock import ManualClock
from edge_sim.config import EdgeConfig
from edge_sim.faults import ColoFault
from edge_sim.geo import CountryCentroids
from edge_sim.network import EdgeNetwork

MODEL = "m"
# Four colos on the equator, 1 degree (~111 km, ~1.7 ms RTT) apart: a client at 0,0 ranks them
# AAA, BBB, CCC, DDD.
COLOS = [
    {"id": f"{letter * 3}", "city": letter, "country": "GH", "lat": 0.0, "lon": float(lon)}
    for lon, letter in enumerate("ABCD")
]
AT_AAA = {"x-client-geo": "0,0"}
AT_DDD = {"x-client-geo": "0,3"}
CONSECUTIVE_FAILURES = 2
EJECTION_S = 10.0
WARM_WINDOW_S = 300.0


@dataclass
class Rig:
    clock: ManualClock
    network: EdgeNetwork
    warmth: WarmthTracker
    dispatcher: EdgeDispatcher[Reply[str]]

    def state(self, colo_id: str) -> dict[str, Any]:
        (state,) = [s for s in self.network.colo_states() if s["id"] == colo_id]
        return state

    def assert_no_slot_held(self) -> None:
        assert {s["id"]: s["in_flight"] for s in self.network.colo_states()} == dict.fromkeys(
            ("AAA", "BBB", "CCC", "DDD"), 0
        )


def make_rig(*, default_cold_start_ms: float = 0.0, max_attempts: int = 3) -> Rig:
    """default_cold_start_ms=0 makes a warm neighbour never worth its extra RTT, so tests that are
    not about warmth see plain nearest-first order."""
    clock = ManualClock(1000.0)
    config = EdgeConfig.model_validate(
        {
            "topology": {"colos": COLOS},
            "latency": {"real_delay_scale": 0.0},  # asyncio.sleep(0): no real waiting
            "health": {
                "consecutive_failures": CONSECUTIVE_FAILURES,
                "base_ejection_s": EJECTION_S,
                "max_ejection_percent": 100,
            },
        }
    )
    network = EdgeNetwork(config, clock=clock, centroids=CountryCentroids({"GH": (0.0, 1.5)}))
    warmth = WarmthTracker(WARM_WINDOW_S, default_cold_start_ms, clock=clock)
    return Rig(clock, network, warmth, EdgeDispatcher(network, warmth, max_attempts))


def warm_reply(value: str = "ok") -> Reply[str]:
    """A reply from a replica that was ready long before any request here arrived."""
    return Reply(value, replica_ready_at=0.0, replica_load_s=0.5)


@dataclass
class ScriptedCall:
    """A model call that plays its outcomes in order (an exception is raised, a Reply returned);
    the call cannot see the colo, so the script follows the failover order."""

    outcomes: list[BaseException | Reply[str] | Callable[[], Awaitable[Reply[str]]]]
    calls: int = 0
    seen: list[Any] = field(default_factory=list)

    async def __call__(self) -> Reply[str]:
        outcome = self.outcomes[min(self.calls, len(self.outcomes) - 1)]
        self.calls += 1
        if isinstance(outcome, BaseException):
            raise outcome
        if isinstance(outcome, Reply):
            return outcome
        return await outcome()


def dispatch(
    rig: Rig,
    call: Callable[[], Awaitable[Reply[str]]],
    headers: dict[str, str] = AT_AAA,
    deadline_s: float = 30.0,
) -> tuple[Reply[str], EdgeTrace]:
    return asyncio.run(
        rig.dispatcher.dispatch(MODEL, headers, None, call, lambda r: r, deadline_s=deadline_s)
    )


# ---- choosing a colo ---------------------------------------------------------------------------


@pytest.mark.parametrize(("headers", "expected"), [(AT_AAA, "AAA"), (AT_DDD, "DDD")])
def test_nearest_colo_serves_the_client(headers: dict[str, str], expected: str):
    rig = make_rig()
    call = ScriptedCall([warm_reply("hello")])
    reply, trace = dispatch(rig, call, headers)
    assert reply.value == "hello" and call.calls == 1
    assert (trace.colo, trace.reason, trace.tried) == (expected, "nearest", [expected])
    assert trace.cold_start_ms is None
    # The client stands on the colo: only the first hop's RTT (arccos rounding aside).
    assert trace.rtt_ms == pytest.approx(2 * rig.network.config.latency.per_hop_ms, abs=1e-3)
    rig.assert_no_slot_held()


def test_nearest_for_a_cache_hit_picks_the_first_choice_without_a_call():
    rig = make_rig()
    trace = asyncio.run(rig.dispatcher.nearest(MODEL, AT_DDD, None))
    assert (trace.colo, trace.reason, trace.tried, trace.cache) == ("DDD", "nearest", ["DDD"], None)
    rig.assert_no_slot_held()


@pytest.mark.parametrize(
    ("headers", "header"),
    [
        ({"x-client-geo": "north"}, "x-client-geo"),
        ({"x-client-geo": "91,0"}, "x-client-geo"),
        ({"x-client-geo": "0"}, "x-client-geo"),
        ({"cf-ipcountry": "QQ"}, "cf-ipcountry"),
    ],
)
def test_a_bad_location_header_is_a_400_naming_the_header(headers: dict[str, str], header: str):
    rig = make_rig()
    call = ScriptedCall([warm_reply()])
    with pytest.raises(BadHeaderValueError) as caught:
        dispatch(rig, call, headers)
    assert caught.value.status == 400 and caught.value.param == header
    assert header in caught.value.message
    assert call.calls == 0
    with pytest.raises(BadHeaderValueError):
        asyncio.run(rig.dispatcher.nearest(MODEL, headers, None))


def test_a_colo_marked_down_is_skipped_and_comes_back_when_cleared():
    rig = make_rig()
    rig.network.set_fault("AAA", ColoFault(down=True))
    _, trace = dispatch(rig, ScriptedCall([warm_reply()]))
    assert (trace.colo, trace.tried) == ("BBB", ["BBB"])
    assert trace.reason != "failover"  # nothing failed: the plan left AAA out
    rig.network.clear_faults("AAA")
    _, trace = dispatch(rig, ScriptedCall([warm_reply()]))
    assert trace.colo == "AAA"


def test_every_colo_down_is_a_503_with_retry_after():
    rig = make_rig()
    for colo in COLOS:
        rig.network.set_fault(colo["id"], ColoFault(down=True))
    call = ScriptedCall([warm_reply()])
    with pytest.raises(OverloadedError) as caught:
        dispatch(rig, call)
    assert caught.value.status == 503 and caught.value.retry_after_s > 0
    assert call.calls == 0


# ---- failover ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        OverloadedError("queue full"),
        ModelNotReadyError("no replica"),
        InternalServerError("replica crashed"),
    ],
)
def test_a_5xx_at_the_first_colo_fails_over_to_the_next(error: ServingError):
    rig = make_rig()
    call = ScriptedCall([error, warm_reply("second")])
    reply, trace = dispatch(rig, call)
    assert reply.value == "second" and call.calls == 2
    assert (trace.colo, trace.reason, trace.tried) == ("BBB", "failover", ["AAA", "BBB"])
    assert trace.headers()["x-edge-failover"] == "AAA,BBB"
    assert rig.state("AAA")["health"]["consecutive_failures"] == 1
    assert rig.state("BBB")["health"]["consecutive_failures"] == 0
    rig.assert_no_slot_held()


@pytest.mark.parametrize(
    "error",
    [
        InvalidRequestError("bad temperature", param="temperature"),
        ContextLengthExceededError("prompt too long"),
        ModelNotFoundError("no such model"),
    ],
)
def test_a_4xx_is_raised_at_once_and_is_not_a_colo_failure(error: ServingError):
    rig = make_rig()
    # More 4xx in a row than it takes to eject a colo for failures.
    for _ in range(CONSECUTIVE_FAILURES + 1):
        call = ScriptedCall([error, warm_reply()])
        with pytest.raises(type(error)) as caught:
            dispatch(rig, call)
        assert caught.value is error
        assert call.calls == 1  # no failover to BBB
    health = rig.state("AAA")["health"]
    assert health["state"] == "healthy"
    assert health["consecutive_failures"] == 0 and health["window_failures"] == 0
    rig.assert_no_slot_held()
    _, trace = dispatch(rig, ScriptedCall([warm_reply()]))
    assert trace.colo == "AAA"


def test_an_injected_fault_fails_over_without_calling_the_model():
    rig = make_rig()
    rig.network.set_fault("AAA", ColoFault(error_rate=1.0))
    call = ScriptedCall([warm_reply("from BBB")])
    reply, trace = dispatch(rig, call)
    assert reply.value == "from BBB" and call.calls == 1  # AAA failed before the call
    assert (trace.colo, trace.reason, trace.tried) == ("BBB", "failover", ["AAA", "BBB"])
    assert rig.state("AAA")["health"]["consecutive_failures"] == 1
    rig.assert_no_slot_held()


def test_an_injected_fault_at_every_colo_is_a_503_naming_it():
    rig = make_rig()
    for colo in COLOS:
        rig.network.set_fault(colo["id"], ColoFault(error_rate=1.0))
    call = ScriptedCall([warm_reply()])
    with pytest.raises(OverloadedError) as caught:
        dispatch(rig, call)
    assert caught.value.status == 503
    assert InjectedFaultError.__name__ in caught.value.message
    assert call.calls == 0


def test_exhausting_max_attempts_raises_the_last_error():
    rig = make_rig(max_attempts=2)
    first, last = OverloadedError("AAA is full"), OverloadedError("BBB is full", retry_after_s=7)
    call = ScriptedCall([first, last, warm_reply("never")])
    with pytest.raises(OverloadedError) as caught:
        dispatch(rig, call)
    assert caught.value is last
    assert caught.value.status == 503 and caught.value.retry_after_s == 7
    assert call.calls == 2  # CCC is third in the plan: never tried
    assert [rig.state(c)["health"]["consecutive_failures"] for c in ("AAA", "BBB", "CCC")] == [
        1,
        1,
        0,
    ]
    rig.assert_no_slot_held()


def test_a_call_that_times_out_on_its_own_fails_over():
    rig = make_rig()
    call = ScriptedCall([TimeoutError(), warm_reply("from BBB")])
    reply, trace = dispatch(rig, call)
    assert reply.value == "from BBB"
    assert (trace.reason, trace.tried) == ("failover", ["AAA", "BBB"])


def test_a_hung_colo_gets_only_its_share_of_the_deadline_then_fails_over():
    rig = make_rig()

    async def hang() -> Reply[str]:
        await asyncio.Event().wait()  # nothing ever sets it: only the attempt's limit ends it
        raise AssertionError("unreachable")

    call = ScriptedCall([hang, warm_reply("from BBB")])
    started = time.monotonic()
    result, trace = dispatch(rig, call, deadline_s=0.3)
    assert time.monotonic() - started < 5.0
    assert result.value == "from BBB"
    assert trace.reason == "failover" and trace.tried == ["AAA", "BBB"]
    assert rig.state("AAA")["health"]["consecutive_failures"] == 1
    rig.assert_no_slot_held()


def test_calls_that_all_hang_become_a_503_within_the_deadline():
    rig = make_rig()

    async def hang() -> Reply[str]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    call = ScriptedCall([hang, hang, hang, hang])
    started = time.monotonic()
    with pytest.raises(OverloadedError) as caught:
        dispatch(rig, call, deadline_s=0.1)
    assert time.monotonic() - started < 5.0  # bounded by the deadline, not by the calls
    assert caught.value.status == 503 and "TimeoutError" in caught.value.message
    rig.assert_no_slot_held()


# ---- outlier detection -------------------------------------------------------------------------


def test_consecutive_failures_eject_a_colo_from_later_plans():
    rig = make_rig()
    for _ in range(CONSECUTIVE_FAILURES):
        _, trace = dispatch(rig, ScriptedCall([OverloadedError("busy"), warm_reply()]))
        assert trace.tried == ["AAA", "BBB"]
    assert rig.state("AAA")["state"] == "ejected"
    plan = rig.dispatcher.plan(MODEL, AT_AAA, None)
    assert "AAA" not in [c.colo_id for c in plan.candidates]
    call = ScriptedCall([warm_reply("from BBB")])
    _, trace = dispatch(rig, call)
    assert (trace.colo, trace.tried, call.calls) == ("BBB", ["BBB"], 1)
    # After the ejection time AAA is probed again, and a success brings it back.
    rig.clock.advance(EJECTION_S)
    _, trace = dispatch(rig, ScriptedCall([warm_reply()]))
    assert trace.colo == "AAA"
    assert rig.state("AAA")["state"] == "healthy"


# ---- cold starts and warmth --------------------------------------------------------------------


def test_a_reply_from_a_replica_ready_after_arrival_is_a_cold_start():
    rig = make_rig(default_cold_start_ms=3000.0)
    wait_s = 1.0

    async def cold() -> Reply[str]:
        # The replica became ready a second after this call began: the request waited on it.
        return Reply("cold", replica_ready_at=time.time() + wait_s, replica_load_s=0.8)

    _, trace = dispatch(rig, ScriptedCall([cold]))
    assert trace.cold_start_ms is not None
    assert wait_s * 1000 <= trace.cold_start_ms < wait_s * 1000 + 5000
    assert rig.warmth.cold_start_ms(MODEL) == trace.cold_start_ms  # first measurement replaces
    assert rig.warmth.last_cold_start[MODEL]["replica_load_s"] == 0.8
    headers = trace.headers()
    assert headers["x-edge-cold-start"] == "1"
    assert headers["x-edge-cold-start-ms"] == f"{trace.cold_start_ms:.0f}"


def test_a_reply_from_a_ready_replica_is_not_a_cold_start():
    rig = make_rig(default_cold_start_ms=3000.0)
    _, trace = dispatch(rig, ScriptedCall([warm_reply()]))
    assert trace.cold_start_ms is None
    assert trace.headers()["x-edge-cold-start"] == "0"
    assert "x-edge-cold-start-ms" not in trace.headers()
    assert rig.warmth.cold_start_ms(MODEL) == 3000.0
    assert MODEL not in rig.warmth.last_cold_start


def test_cold_start_estimate_is_a_moving_average():
    clock = ManualClock()
    warmth = WarmthTracker(WARM_WINDOW_S, 3000.0, clock=clock)
    assert warmth.record("AAA", MODEL, Reply("x", 12.0, 1.0), arrived_at=10.0) == pytest.approx(
        2000.0
    )
    assert warmth.cold_start_ms(MODEL) == pytest.approx(2000.0)
    assert warmth.record("AAA", MODEL, Reply("x", 21.0, 1.0), arrived_at=20.0) == pytest.approx(
        1000.0
    )
    assert warmth.cold_start_ms(MODEL) == pytest.approx(0.7 * 2000.0 + 0.3 * 1000.0)
    assert warmth.cold_start_ms("other") == 3000.0  # per model


def test_a_colo_stays_warm_for_the_window_after_serving():
    clock = ManualClock()
    warmth = WarmthTracker(WARM_WINDOW_S, 3000.0, clock=clock)
    assert not warmth.is_warm("AAA", MODEL)
    warmth.record("AAA", MODEL, warm_reply(), arrived_at=1.0)
    assert warmth.is_warm("AAA", MODEL) and not warmth.is_warm("BBB", MODEL)
    assert not warmth.is_warm("AAA", "other")
    clock.advance(WARM_WINDOW_S - 1)
    assert warmth.is_warm("AAA", MODEL)
    clock.advance(1)
    assert not warmth.is_warm("AAA", MODEL)


def test_a_warm_neighbour_beats_a_cold_nearest_colo_which_then_warms_up():
    rig = make_rig(default_cold_start_ms=3000.0)
    rig.warmth.record("BBB", MODEL, warm_reply(), arrived_at=time.time())
    call = ScriptedCall([warm_reply("from BBB")])
    reply, trace = dispatch(rig, call)
    assert reply.value == "from BBB"
    assert (trace.colo, trace.reason, trace.tried) == ("BBB", "warm", ["BBB"])
    assert trace.headers()["x-edge-route-reason"] == "warm"
    # AAA started warming when it was skipped: warm one cold start (3 s) later, not before.
    assert not rig.warmth.is_warm("AAA", MODEL)
    rig.clock.advance(2.5)
    assert not rig.warmth.is_warm("AAA", MODEL)
    rig.clock.advance(0.5)
    assert rig.warmth.is_warm("AAA", MODEL)
    _, trace = dispatch(rig, ScriptedCall([warm_reply()]))
    assert (trace.colo, trace.reason) == ("AAA", "nearest")


def test_a_warm_neighbour_further_than_a_cold_start_is_not_worth_it():
    # BBB is ~1.7 ms further than AAA; a 1 ms cold start is cheaper than that detour.
    rig = make_rig(default_cold_start_ms=1.0)
    rig.warmth.record("BBB", MODEL, warm_reply(), arrived_at=time.time())
    _, trace = dispatch(rig, ScriptedCall([warm_reply()]))
    assert (trace.colo, trace.reason) == ("AAA", "nearest")


# ---- EdgeTrace ---------------------------------------------------------------------------------


def test_trace_headers_for_a_plain_request():
    trace = EdgeTrace("AAA", 12.345, "nearest", ["AAA"])
    assert trace.headers() == {
        "x-edge-colo": "AAA",
        "x-edge-rtt-ms": "12.3",
        "x-edge-route-reason": "nearest",
        "x-edge-cold-start": "0",
    }


def test_trace_headers_for_a_failover_after_a_cold_start_served_from_cache():
    trace = EdgeTrace("CCC", 3.0, "failover", ["AAA", "BBB", "CCC"], 1234.56, "MISS")
    assert trace.headers() == {
        "x-edge-colo": "CCC",
        "x-edge-rtt-ms": "3.0",
        "x-edge-route-reason": "failover",
        "x-edge-cold-start": "1",
        "x-edge-failover": "AAA,BBB,CCC",
        "x-edge-cold-start-ms": "1235",
        "x-edge-cache": "MISS",
    }


def test_only_a_failover_lists_the_colos_tried():
    assert "x-edge-failover" not in EdgeTrace("BBB", 1.0, "spillover", ["BBB"]).headers()
