"""Fair queueing between keys in front of a model, per router replica: at most this router's
share of the model's limit in flight from here (the limit split over the running routers, so the
replicas' own queues, which serve in arrival order, stay empty); past it, requests wait per key
and are let in by weighted start-time fair queueing over keys, not in arrival order, so a key
that floods a model cannot take all of it from the others. A key may have a cap of its own; the
queue is bounded, and its overflow is refused from the key holding the most of it (by weight),
with a Retry-After."""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from deployments.config import FairQueueConfig
from deployments.errors import BusyError, QueueFullError, WaitBudgetExceededError
from deployments.ingress.edge.calls import CallResult
from deployments.ingress.edge.clock import EdgeClock, SystemClock
from deployments.ingress.edge.waiting import BUSY_MESSAGE, WaitLimits
from edge_sim.regions import PoolView

# How much of each new hold time the Retry-After's mean takes in: a few dozen requests' worth.
HOLD_TIME_SMOOTHING = 0.05
MIN_RETRY_AFTER_S = 1.0


class KeyedRequest(Protocol):
    """What the gate reads of a request: whose it is, that key's weight, how long it may wait."""

    @property
    def key_id(self) -> str: ...

    @property
    def key_weight(self) -> float: ...

    @property
    def wait_limits(self) -> WaitLimits: ...


@dataclass(eq=False)
class _Waiter:
    key: _Key
    start_tag: float  # its virtual start time: the order keys are served in
    order: int  # arrival, for equal tags
    let_in: asyncio.Future[Slot]


@dataclass(eq=False)
class _Key:
    """One key's side of a model's queue: its waiters in arrival order, its requests in flight,
    and the virtual time its last request finishes at (1/weight after it started)."""

    key_id: str
    weight: float
    waiting: deque[_Waiter] = field(default_factory=deque)
    in_flight: int = 0
    finish_tag: float = 0.0

    @property
    def queue_share(self) -> float:
        return len(self.waiting) / self.weight


class Slot:
    """A request's place among the model's requests in flight; `release` gives it back (once,
    however often it is called)."""

    def __init__(self, queue: FairQueue, key: _Key, taken_at: float):
        self._queue, self._key, self._taken_at = queue, key, taken_at
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._queue._give_back(self._key, self._taken_at)

    def hold_until_closed(self, result: CallResult) -> CallResult:
        """The call's result, holding this slot while it is read: a unary reply gives it back now;
        a stream when it ends, fails or is closed (its replica's batch slot is held as long)."""
        if result.rest is None:
            self.release()
            return result
        return CallResult(result.reply, _SlotStream(result.rest, self))


class _SlotStream:
    """A ReplyStream that gives its slot back once nobody reads on: at its end, its failure,
    its reader's cancellation, its `cancel`, or else when it is dropped unread (a response whose
    client left before its body was sent), so no path leaks the model's slot."""

    def __init__(self, stream: Any, slot: Slot):
        self._stream, self._slot = stream, slot
        # not at exit: the event loop its waiters belong to is gone by then
        weakref.finalize(self, slot.release).atexit = False

    def __aiter__(self) -> _SlotStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._stream.__anext__()
        except BaseException:  # its end, its failure, or its reader cancelled
            self._slot.release()
            raise

    def cancel(self) -> None:
        self._slot.release()
        self._stream.cancel()


class FairQueue:
    """One model's gate in this router replica. `limit()` is how many of its requests may be in
    flight now, `reserved()` how many of those only a key with none in flight may take (both
    read on every change: they follow the model's running replicas). Streams hold their slot
    to the end, so without a reserve a key sending one request at a time would wait for one of
    a flood's streams to end, however fair the order."""

    def __init__(
        self,
        limit: Callable[[], int],
        config: FairQueueConfig,
        clock: EdgeClock | None = None,
        reserved: Callable[[], int] = lambda: 0,
    ):
        self._limit = limit
        self._reserved = reserved
        self._config = config
        self._clock = clock or SystemClock()
        self._keys: dict[str, _Key] = {}
        self._virtual_time = 0.0  # the start tag of the latest request let in
        self._arrivals = itertools.count()
        self._mean_hold_s = 0.0  # how long a slot is held, for the Retry-After
        self.in_flight = 0
        self.waiting = 0

    async def enter(self, request: KeyedRequest) -> Slot:
        """A slot for the request: at once while the model has room and the key is under its cap,
        else once fair sharing lets it in. BusyError (429) for a request that asked not to wait;
        QueueFullError (503) when the queue is full and this key holds the most of it."""
        self._let_in()  # the model may have more room since the last change (a replica started)
        key = self._key(request.key_id, request.key_weight)
        if self._has_room(key):
            return self._take(key, self._tag(key))
        try:
            if request.wait_limits.reject_if_busy:
                raise BusyError(BUSY_MESSAGE, retry_after_s=self._retry_after_s())
            self._make_room(key)
        except (BusyError, QueueFullError):
            self._forget_if_idle(key)
            raise
        waiter = _Waiter(
            key, self._tag(key), next(self._arrivals), asyncio.get_running_loop().create_future()
        )
        key.waiting.append(waiter)
        self.waiting += 1
        budget_s = request.wait_limits.max_wait_s
        expiry = (
            None
            if budget_s is None
            else self._clock.call_later(budget_s, partial(self._past_budget, waiter, budget_s))
        )
        try:
            return await waiter.let_in
        except BaseException:
            self._leave(waiter)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()

    def _past_budget(self, waiter: _Waiter, budget_s: float) -> None:
        """The request's wait budget (`x-edge-max-wait-ms`) ended in the queue: a 503 whose
        Retry-After is when it may find room."""
        if not waiter.let_in.done():
            waiter.let_in.set_exception(
                WaitBudgetExceededError(
                    f"the model stayed full for the request's wait budget "
                    f"(x-edge-max-wait-ms: {round(budget_s * 1000)})",
                    retry_after_s=self._retry_after_s(),
                )
            )

    def _key(self, key_id: str, weight: float) -> _Key:
        key = self._keys.get(key_id)
        if key is None:
            key = self._keys[key_id] = _Key(key_id, weight)
        key.weight = weight  # a key's weight may change while it is in use (the keys reloaded)
        return key

    def _has_room(self, key: _Key) -> bool:
        cap = self._config.max_in_flight_per_key
        return self.in_flight < self._room_for(key) and (cap is None or key.in_flight < cap)

    def _room_for(self, key: _Key) -> int:
        """The in-flight count `key` may fill up to: the whole limit for a key with nothing in
        flight, the limit less the reserve for one already served."""
        limit = self._limit()
        return limit if key.in_flight == 0 else limit - min(self._reserved(), limit - 1)

    def _tag(self, key: _Key) -> float:
        """The request's virtual start: its key's last finish, or now if the key was idle (an
        idle key banks no credit); it finishes 1/weight later."""
        start = max(self._virtual_time, key.finish_tag)
        key.finish_tag = start + 1.0 / key.weight
        return start

    def _take(self, key: _Key, start_tag: float) -> Slot:
        self._virtual_time = max(self._virtual_time, start_tag)
        key.in_flight += 1
        self.in_flight += 1
        return Slot(self, key, self._clock.now())

    def _let_in(self) -> None:
        """While the model has room: the waiter with the earliest start tag among keys under
        their cap and with room (the reserve only for keys with nothing in flight)."""
        cap = self._config.max_in_flight_per_key
        while self.waiting and self.in_flight < self._limit():
            heads = [
                k.waiting[0]
                for k in self._keys.values()
                if k.waiting
                and (cap is None or k.in_flight < cap)
                and self.in_flight < self._room_for(k)
            ]
            if not heads:
                return
            first = min(heads, key=lambda w: (w.start_tag, w.order))
            first.key.waiting.popleft()
            self.waiting -= 1
            if not first.let_in.done():  # done: cancelled, its task not yet told (it leaves)
                first.let_in.set_result(self._take(first.key, first.start_tag))

    def _make_room(self, newcomer: _Key) -> None:
        """A full queue refuses one request: the newest of the key holding the most of it by
        weight, if that key would still hold more than the newcomer's once it joined; else the
        newcomer."""
        if self.waiting < self._config.max_waiting:
            return
        most = max(self._keys.values(), key=lambda k: (k.queue_share, -k.weight))
        refusal = QueueFullError(
            "the model's queue is full; retry shortly", retry_after_s=self._retry_after_s()
        )
        if most is newcomer or most.queue_share <= (len(newcomer.waiting) + 1) / newcomer.weight:
            raise refusal
        refused = most.waiting.pop()
        self.waiting -= 1
        if not refused.let_in.done():
            refused.let_in.set_exception(refusal)
        self._forget_if_idle(most)

    def _leave(self, waiter: _Waiter) -> None:
        """A waiter that will not take its slot (its client left, or it was refused): out of the
        queue, or its slot given back if it was let in in the same turn."""
        let_in = waiter.let_in
        if let_in.done() and not let_in.cancelled() and let_in.exception() is None:
            let_in.result().release()
            return
        if not let_in.done():
            let_in.cancel()
        if waiter in waiter.key.waiting:
            waiter.key.waiting.remove(waiter)
            self.waiting -= 1
        self._forget_if_idle(waiter.key)

    def _give_back(self, key: _Key, taken_at: float) -> None:
        held_s = self._clock.now() - taken_at
        self._mean_hold_s += HOLD_TIME_SMOOTHING * (held_s - self._mean_hold_s)
        key.in_flight -= 1
        self.in_flight -= 1
        self._let_in()
        self._forget_if_idle(key)

    def _forget_if_idle(self, key: _Key) -> None:
        """A key with nothing waiting or in flight leaves the table: its next request starts at
        the virtual time then, as an idle key's does."""
        if not key.waiting and not key.in_flight and self._keys.get(key.key_id) is key:
            del self._keys[key.key_id]

    def _retry_after_s(self) -> float:
        """When a refused request may find room: the queue ahead of it served at the model's
        limit, each request holding its slot the mean time seen so far."""
        rounds = (self.waiting + 1) / max(1, self._limit())
        return max(MIN_RETRY_AFTER_S, rounds * self._mean_hold_s)


class FairGates:
    """A FairQueue per gated model of this router replica, each limited to this router's share of
    the model's running replicas (not ejected, in any region) x `in_flight_per_replica`: the
    whole split evenly over the `routers()` running (the front balances connections across
    them), rounded up, so together they fill the replicas and no more; of it, the share of
    `reserved_per_replica` x replicas kept for keys with nothing in flight. A model with no
    replica counts as one, so the request that wakes it goes out."""

    def __init__(
        self,
        config: FairQueueConfig,
        models: Collection[str],
        pools: Callable[[str], dict[str, PoolView]],
        clock: EdgeClock | None = None,
        routers: Callable[[], int] = lambda: 1,
    ):
        self._config = config
        self._pools = pools
        self._routers = routers
        self.queues = {
            model: FairQueue(
                partial(self._limit, model), config, clock, partial(self._reserved, model)
            )
            for model in models
        }

    def _limit(self, model: str) -> int:
        return self._share(model, self._config.in_flight_per_replica)

    def _reserved(self, model: str) -> int:
        return self._share(model, self._config.reserved_per_replica)

    def _share(self, model: str, per_replica: int) -> int:
        """This router's share of `per_replica` x the model's running replicas, rounded up."""
        running = sum(view.running for view in self._pools(model).values() if not view.ejected)
        return -(-max(1, running) * per_replica // max(1, self._routers()))

    async def enter(self, model: str, request: KeyedRequest) -> Slot | None:
        """The request's slot for `model`, None for a model not gated."""
        queue = self.queues.get(model)
        return None if queue is None else await queue.enter(request)
