"""The fair queue between keys in front of a model (deployments.ingress.edge.fair_queue): who is
let in when the model is full, by weight and by key cap; the bounded queue's refusals; and that
no way out of the queue (cancelled, refused, past its budget, a stream dropped) leaks a slot.
Event-loop turns and a manual clock only: no sleeps."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from deployments.config import PROJECT_ROOT, FairQueueConfig
from deployments.config.security import RateLimits, SecurityConfig
from deployments.contracts.replies import Reply
from deployments.errors import BusyError, QueueFullError, WaitBudgetExceededError
from deployments.ingress.edge.calls import CallResult
from deployments.ingress.edge.clock import ManualEdgeClock
from deployments.ingress.edge.fair_queue import FairGates, FairQueue, Slot
from deployments.ingress.edge.waiting import WaitLimits
from edge_sim.regions import PoolView


@dataclass(frozen=True)
class Req:
    key_id: str
    key_weight: float = 1.0
    wait_limits: WaitLimits = field(default_factory=WaitLimits)


async def turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


class Rig:
    """A FairQueue of `limit` slots whose requests are tasks: `send` queues one, `admitted`
    lists the keys in the order they got a slot, `finish` gives the oldest held slot back."""

    def __init__(
        self, limit: int, clock: ManualEdgeClock | None = None, reserved: int = 0, **config: Any
    ):
        self.limit = limit
        self.reserved = reserved
        self.queue = FairQueue(
            lambda: self.limit, FairQueueConfig(**config), clock, lambda: self.reserved
        )
        self.admitted: list[str] = []
        self.held: list[Slot] = []
        self.tasks: list[asyncio.Task[None]] = []

    def send(self, key: str, weight: float = 1.0, **limits: Any) -> asyncio.Task[None]:
        async def one() -> None:
            slot = await self.queue.enter(Req(key, weight, WaitLimits(**limits)))
            self.admitted.append(key)
            self.held.append(slot)

        task = asyncio.get_running_loop().create_task(one())
        self.tasks.append(task)
        return task

    async def finish(self, count: int = 1) -> None:
        for _ in range(count):
            self.held.pop(0).release()
            await turns()


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


def test_a_quiet_key_goes_ahead_of_a_flood_queued_before_it() -> None:
    async def scenario() -> None:
        rig = Rig(limit=4)
        for _ in range(52):  # 4 take the model, 48 wait
            rig.send("flood")
        await turns()
        assert (rig.queue.in_flight, rig.queue.waiting) == (4, 48)
        quiet = rig.send("quiet")
        await turns()
        assert not quiet.done()  # the model is full for everyone
        await rig.finish()
        assert rig.admitted[4:] == ["quiet"]  # the first slot freed is the quiet key's
        await rig.finish(20)
        assert rig.admitted.count("flood") == 24  # the flood goes on behind it, in order

    run(scenario)


def test_weights_two_to_one_share_the_freed_slots_two_to_one() -> None:
    async def scenario() -> None:
        rig = Rig(limit=1)
        rig.send("warmup")
        await turns()
        for _ in range(30):
            rig.send("heavy", weight=2.0)
            rig.send("light", weight=1.0)
        await turns()
        await rig.finish(30)
        served = rig.admitted[1:31]
        assert served.count("heavy") == 20
        assert served.count("light") == 10
        # interleaved, not one key's run then the other's
        assert served[:6].count("light") == 2

    run(scenario)


def test_a_key_at_its_cap_waits_while_other_keys_use_the_free_room() -> None:
    async def scenario() -> None:
        rig = Rig(limit=10, max_in_flight_per_key=2)
        for _ in range(5):
            rig.send("greedy")
        await turns()
        assert rig.admitted == ["greedy", "greedy"]
        assert (rig.queue.in_flight, rig.queue.waiting) == (2, 3)
        rig.send("other")
        await turns()
        assert rig.admitted[-1] == "other"  # room in the model: no wait behind the capped key
        await rig.finish()  # a greedy slot back: its next one in, still 2 of its own at most
        assert rig.admitted.count("greedy") == 3
        assert rig.queue.waiting == 2

    run(scenario)


def test_a_full_queue_refuses_the_flood_not_the_quiet_key_with_a_retry_after() -> None:
    async def scenario() -> None:
        rig = Rig(limit=1, max_waiting=4)
        for _ in range(5):  # 1 in, 4 waiting: the queue is full
            rig.send("flood")
        await turns()
        overflow = rig.send("flood")
        await turns()
        error = overflow.exception()
        assert isinstance(error, QueueFullError)
        assert error.status == 503 and error.response_headers()["retry-after"] == "1"
        quiet = rig.send("quiet")
        await turns()
        assert not quiet.done()  # queued: the flood's newest waiter made room for it
        refused = [t for t in rig.tasks[1:5] if t.done()]
        assert len(refused) == 1 and isinstance(refused[0].exception(), QueueFullError)
        assert refused[0] is rig.tasks[4]
        assert rig.queue.waiting == 4
        await rig.finish()
        assert rig.admitted[-1] == "quiet"

    run(scenario)


def test_no_queue_at_all_refuses_at_once() -> None:
    async def scenario() -> None:
        rig = Rig(limit=1, max_waiting=0)
        rig.send("a")
        second = rig.send("b")
        await turns()
        assert isinstance(second.exception(), QueueFullError)
        assert rig.queue.waiting == 0

    run(scenario)


def test_the_retry_after_follows_how_long_slots_are_held() -> None:
    async def scenario() -> None:
        clock = ManualEdgeClock()
        rig = Rig(limit=1, clock=clock, max_waiting=1)
        for _ in range(40):  # slots held 10 s each: the mean hold climbs towards it
            rig.send("a")
            await turns()
            clock.advance(10.0)
            await rig.finish()
        rig.send("a")
        rig.send("a")
        overflow = rig.send("a")
        await turns()
        error = overflow.exception()
        assert isinstance(error, QueueFullError)
        # two requests' worth ahead at one slot, about 8.7 s each so far
        assert 17 < error.retry_after_s < 18  # to the millisecond: retry-after-ms says it
        assert error.response_headers()["retry-after"] == "18"

    run(scenario)


def test_reject_if_busy_is_a_429_instead_of_a_wait() -> None:
    async def scenario() -> None:
        rig = Rig(limit=1)
        rig.send("a")
        busy = rig.send("b", reject_if_busy=True)
        await turns()
        assert isinstance(busy.exception(), BusyError)
        assert busy.exception().status == 429  # type: ignore[union-attr]
        assert rig.queue.waiting == 0

    run(scenario)


def test_a_wait_budget_that_ends_in_the_queue_is_a_503_and_leaves_it() -> None:
    async def scenario() -> None:
        clock = ManualEdgeClock()
        rig = Rig(limit=1, clock=clock)
        rig.send("a")
        waiting = rig.send("b", max_wait_s=0.5)
        await turns()
        clock.advance(0.4)
        await turns()
        assert not waiting.done()
        clock.advance(0.2)
        await turns()
        assert isinstance(waiting.exception(), WaitBudgetExceededError)
        assert rig.queue.waiting == 0
        await rig.finish()
        assert rig.queue.in_flight == 0

    run(scenario)


def test_a_client_that_leaves_frees_its_place_and_is_never_let_in() -> None:
    async def scenario() -> None:
        rig = Rig(limit=1)
        rig.send("a")
        leaving, staying = rig.send("b"), rig.send("c")
        await turns()
        leaving.cancel()
        await turns()
        assert rig.queue.waiting == 1
        await rig.finish()
        assert rig.admitted == ["a", "c"]
        await rig.finish()
        assert (rig.queue.in_flight, rig.queue.waiting) == (0, 0)
        assert staying.done() and not rig.queue._keys  # no key left behind

    run(scenario)


def test_a_client_that_leaves_as_it_is_let_in_gives_the_slot_back() -> None:
    async def scenario() -> None:
        rig = Rig(limit=1)
        rig.send("a")
        late = rig.send("b")
        await turns()
        rig.held.pop().release()  # "b" is let in ...
        late.cancel()  # ... and cancelled before its task ran again
        await turns()
        assert late.cancelled()
        assert (rig.queue.in_flight, rig.queue.waiting) == (0, 0)

    run(scenario)


def reply(value: str) -> Reply[str]:
    return Reply(value, replica_ready_at=0.0, replica_load_s=0.0)


def _stream_result() -> tuple[CallResult, FakeStream]:
    stream = FakeStream(["b", "c"])
    return CallResult(reply("a"), stream), stream


class FakeStream:
    def __init__(self, items: list[str]):
        self.items, self.cancelled = items, False

    async def __anext__(self) -> Reply[str]:
        if not self.items:
            raise StopAsyncIteration
        return reply(self.items.pop(0))

    def cancel(self) -> None:
        self.cancelled = True


def test_a_unary_reply_gives_its_slot_back_at_once_a_stream_at_its_end() -> None:
    async def scenario() -> None:
        queue = FairQueue(lambda: 4, FairQueueConfig())
        unary = (await queue.enter(Req("a"))).hold_until_closed(CallResult(reply("x")))
        assert unary.rest is None and queue.in_flight == 0
        result, _ = _stream_result()
        held = (await queue.enter(Req("a"))).hold_until_closed(result)
        assert queue.in_flight == 1
        assert [(await held.rest.__anext__()).value for _ in range(2)] == ["b", "c"]
        assert queue.in_flight == 1  # read on: still the replica's
        with pytest.raises(StopAsyncIteration):
            await held.rest.__anext__()
        assert queue.in_flight == 0
        held.close()  # the reader's own close after the end changes nothing
        assert queue.in_flight == 0

    run(scenario)


def test_a_stream_closed_or_dropped_unread_gives_its_slot_back() -> None:
    async def scenario() -> None:
        queue = FairQueue(lambda: 4, FairQueueConfig())
        result, stream = _stream_result()
        closed = (await queue.enter(Req("a"))).hold_until_closed(result)
        closed.close()
        assert stream.cancelled and queue.in_flight == 0
        dropped = (await queue.enter(Req("a"))).hold_until_closed(_stream_result()[0])
        assert queue.in_flight == 1
        del dropped
        gc.collect()
        assert queue.in_flight == 0

    run(scenario)


def test_gates_follow_the_running_replicas_and_gate_only_their_models() -> None:
    views = {"eu": PoolView(running=2), "us": PoolView(running=3, ejected=True)}
    gates = FairGates(FairQueueConfig(in_flight_per_replica=8), ["chat"], lambda model: views)
    assert gates._limit("chat") == 16  # an ejected region's replicas take nothing
    views = {"eu": PoolView(running=0)}
    assert gates._limit("chat") == 8  # cold: one replica's worth goes out to wake it

    async def ungated() -> None:
        assert await gates.enter("embedding", Req("a")) is None

    run(ungated)


def test_a_key_with_nothing_in_flight_takes_a_reserved_slot_at_once_beside_a_flood() -> None:
    async def scenario() -> None:
        rig = Rig(limit=4, reserved=1)
        for _ in range(20):
            rig.send("flood")
        await turns()
        assert (rig.queue.in_flight, rig.queue.waiting) == (3, 17)  # the 4th slot is kept
        quiet = rig.send("quiet")
        await turns()
        assert quiet.done() and rig.queue.in_flight == 4  # no wait for a flood stream to end
        second = rig.send("quiet")  # quiet has one in flight now: it queues, first in line
        await turns()
        assert not second.done()
        await rig.finish()  # a flood slot back: served keys (quiet now one) fill only 3 of 4
        assert not second.done() and rig.queue.in_flight == 3
        await rig.finish(2)  # two more: one each by start tag (tied, the flood's came first)
        assert second.done() and rig.admitted[-2:] == ["flood", "quiet"]
        assert rig.queue.waiting == 16  # all but one of the flood's 17 still wait
        rig.reserved = 4  # a reserve as large as the limit still leaves a served key one slot
        assert rig.queue._room_for(rig.queue._keys["flood"]) == 1
        for task in rig.tasks:
            task.cancel()

    run(scenario)


def test_the_reserve_must_leave_a_served_key_room() -> None:
    with pytest.raises(ValidationError, match="reserved_per_replica"):
        FairQueueConfig(in_flight_per_replica=4, reserved_per_replica=4)
    FairQueueConfig(in_flight_per_replica=1)  # the default reserve yields (the gate clamps it)


def test_each_router_holds_its_share_of_the_model_so_the_replicas_queue_nothing() -> None:
    routers = 2
    views = {"eu": PoolView(running=1)}
    gates = FairGates(
        FairQueueConfig(in_flight_per_replica=16),
        ["chat"],
        lambda model: views,
        routers=lambda: routers,
    )
    assert gates._limit("chat") == 8  # two routers fill the replica's 16, not 32
    routers = 3
    assert gates._limit("chat") == 6  # 16 / 3 rounded up: together at most 2 more than it holds
    routers = 0  # not yet known (Serve unread): this router alone
    assert gates._limit("chat") == 16
    routers, views = 32, {"eu": PoolView(running=0)}
    assert gates._limit("chat") == 1  # never 0: the request that wakes a cold model goes out
    routers, views = 2, {"eu": PoolView(running=3)}
    assert (gates._limit("chat"), gates._reserved("chat")) == (24, 3)  # 2 per replica, shared


def test_a_key_weight_is_validated_and_set_per_key() -> None:
    with pytest.raises(ValidationError, match="greater than 0"):
        RateLimits(weight=0)
    security = SecurityConfig(
        default_limits=RateLimits(requests_per_minute=60),
        per_key={"batch": RateLimits(weight=0.25)},
    )
    assert security.limits_for("batch") == RateLimits(requests_per_minute=60, weight=0.25)
    assert security.limits_for("other").weight == 1.0


def test_as_shipped_one_keys_16_requests_at_once_go_out_together() -> None:
    """serve_config.yaml's routers, chat models and fair queue: a lone key's 16 requests at once
    (the front spreads them evenly over the routers) are all in flight, one batch, with the reserve
    still free for another key; the replica takes every request the routers send."""
    shipped = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
    (app,) = shipped["applications"]
    options = {d["name"]: d for d in app["deployments"]}
    fair = FairQueueConfig(**app["args"]["router"].get("fair_queue", {}))
    routers = options["router"]["num_replicas"]
    for model in ("glm-eu", "kimi-eu"):
        deployment = options[model]
        assert deployment["max_ongoing_requests"] == fair.in_flight_per_replica
        assert deployment["user_config"]["max_batch_size"] == fair.in_flight_per_replica

    async def scenario() -> None:
        views = {"eu": PoolView(running=1)}
        gates = [
            FairGates(fair, ["glm"], lambda model: views, routers=lambda: routers)
            for _ in range(routers)
        ]
        flood = [
            asyncio.create_task(gates[i % routers].enter("glm", Req("alone"))) for i in range(16)
        ]
        await turns()
        assert all(task.done() for task in flood)
        quiet = asyncio.create_task(gates[0].enter("glm", Req("quiet")))
        await turns()
        assert quiet.done()  # the reserve was left for it
        in_flight = sum(gate.queues["glm"].in_flight for gate in gates)
        assert in_flight == 17 <= fair.in_flight_per_replica

    run(scenario)
