"""This router replica's side of the shared region state: the typed clients of every (model,
region) pool, edge-control's latest snapshot of their replicas, and what this replica saw since (how
attempts went, and each region's demand for pre-warming)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping
from functools import partial
from typing import Any

from deployments.contracts.edge_control_deployment import EdgeControlClient
from deployments.contracts.model_deployment import ModelClient
from deployments.contracts.warm_pool_deployment import WarmPoolClient
from deployments.ingress.edge.clock import EdgeClock, SystemClock
from deployments.ingress.edge.ready_estimate import ReadyEstimator
from deployments.ingress.edge.waiting import ColdStartNotice
from deployments.pacing import PollPacer
from edge_sim.region_board import BoardSnapshot, Outcome, OutcomeKind
from edge_sim.regions import PoolView, RegionPolicy

log = logging.getLogger("ray.serve")
SYNC_INTERVAL_S = 0.5  # while this replica serves requests or the pools change
IDLE_SYNC_INTERVAL_S = 4.0  # the slowest, reached by doubling while all is still
# A request that ends an idle wait has its sync this much later, not in the milliseconds that
# decide its first byte (both are CPU in this replica's process).
WOKEN_SYNC_DELAY_S = 0.05
FIRST_SYNC_TIMEOUT_S = 3.0
# A region that went cold under an attempt, with no warm region to leave it for, has this many
# of the model's expected cold starts to start a replica before the attempt leaves it.
LOST_AFTER_COLD_STARTS = 2.0


class RegionPools:
    """The client of every (model, region) pool, the latest snapshot from edge-control, and this
    replica's outcomes since (they go to edge-control on the next sync; its own back-pressure
    counts at once)."""

    def __init__(
        self,
        clients: Mapping[str, Mapping[str, ModelClient]],
        policy: RegionPolicy,
        default_cold_start_ms: float,
        control: EdgeControlClient | None = None,
        clock: EdgeClock | None = None,
        warm_pool: WarmPoolClient | None = None,
    ):
        """warm_pool: the warm pool's client (deployments.control.warm_pool), None when it is off;
        once a cold start has been served or a woken pool has its replica (which took a warm
        pool worker), it is asked to replace the worker now, not at its next check."""
        self.clients = {model: dict(by_region) for model, by_region in clients.items()}
        self.policy = policy
        self._default_cold_start_ms = default_cold_start_ms
        self._control = control
        self._clock = clock or SystemClock()
        self.snapshot = BoardSnapshot({}, {})
        self._synced = asyncio.Event() if control is not None else None
        self._full_until: dict[tuple[str, str], float] = {}
        self._outcomes: list[Outcome] = []
        self._demand: dict[tuple[str, str], int] = {}
        self._wakes: dict[tuple[str, str], asyncio.Task[Any]] = {}
        self.estimate = ReadyEstimator(self._clock)  # when a cold pool is expected up
        self._syncer: asyncio.Task[None] | None = None
        self.sync_pacer = PollPacer(SYNC_INTERVAL_S, IDLE_SYNC_INTERVAL_S)
        self._sync_now = asyncio.Event()
        self.last_cold_start: dict[str, dict[str, Any]] = {}
        self._warm_pool = warm_pool

    def client(self, model: str, region: str) -> ModelClient:
        return self.clients[model][region]

    def serving_client(self, model: str) -> ModelClient:
        """A client for calls outside the edge (the moderation gate's): a warm region's if any,
        so a check never waits on a cold start another region could spare."""
        regions = self.clients[model]
        warm = [r for r in regions if self.snapshot.pool(model, r).warm]
        return regions[warm[0] if warm else next(iter(regions))]

    def pools(self, model: str) -> dict[str, PoolView]:
        return {region: self._view(model, region) for region in self.clients[model]}

    def _view(self, model: str, region: str) -> PoolView:
        """The snapshot's view of a pool, with what this replica saw since: its own
        back-pressure answers, and a wake that answered (a replica is up before the snapshot
        says so)."""
        view = self.snapshot.pool(model, region)
        saturated = view.saturated or self._full_until.get((model, region), 0.0) > self._clock.now()
        running = view.running or int(self.estimate.up(model, region))
        if (running, saturated) != (view.running, view.saturated):
            view = PoolView(running, view.ejected, saturated)
        return view

    def watch(self, model: str, region: str, notice: ColdStartNotice) -> RegionWatch:
        """An attempt's watch on the region it is about to wait on."""
        return RegionWatch(self, self._clock, model, region, notice)

    def cold_start_ms(self, model: str) -> float:
        return self.snapshot.cold_start_ms.get(model, self._default_cold_start_ms)

    def expected_ready_s(self, model: str, region: str) -> float:
        """How long until the pool is expected to take a request: a warm one at once, or once
        its back-pressure mark ends; a cold one when its replica is expected up (ReadyEstimator:
        the measured cold starts, less what a wake in flight already waited)."""
        if self._view(model, region).warm:
            return max(0.0, self._full_until.get((model, region), 0.0) - self._clock.now())
        return self.estimate.ready_in_s(
            model,
            region,
            self.cold_start_ms(model) / 1000.0,
            shared_measured=model in self.snapshot.cold_start_ms,
        )

    def waking(self, model: str, region: str) -> bool:
        """Is a wake of this pool in flight?"""
        return self.estimate.waking(model, region)

    def report(
        self, model: str, region: str, kind: OutcomeKind, cold_ms: float | None = None
    ) -> None:
        """How an attempt went; back-pressure also marks the pool full here at once."""
        if kind == "saturated":
            self._full_until[(model, region)] = self._clock.now() + self.policy.saturation_hold_s
        if self._control is not None:
            self._outcomes.append(Outcome(model, region, kind, cold_ms))
            self._wake_syncer()

    def note_demand(self, model: str, region: str) -> None:
        """A request for `model` entered at a colo of `region` (wherever it is served): the
        demand edge-control forecasts that region's traffic from (deployments.control.prewarm)."""
        if self._control is not None:
            key = (model, region)
            self._demand[key] = self._demand.get(key, 0) + 1
            self._wake_syncer()

    def note_cold_start(self, model: str, record: dict[str, Any]) -> None:
        """A request of `model` waited for a replica to start: `record` is /readyz's account."""
        self.last_cold_start[model] = record
        self._replace_taken_worker()

    def wake(self, model: str, region: str) -> None:
        """Send the cold pool one request that queues until Serve has started a replica for it
        (Serve scales a deployment up from zero for queued requests); one at a time per pool."""
        key = (model, region)
        if key in self._wakes and not self._wakes[key].done():
            return
        task = asyncio.get_running_loop().create_task(
            asyncio.wait_for(_await(self.client(model, region).wake()), self.policy.wake_timeout_s)
        )
        task.add_done_callback(partial(self._woken, model, region))
        self._wakes[key] = task
        self.estimate.wake_sent(model, region)

    async def wake_answers(self, model: str, region: str, within_s: float) -> bool:
        """Wake the pool (unless a wake is in flight) and wait up to `within_s` for it to
        answer: True when a replica is up. A pool the snapshot shows cold may have one already
        (another router woke it; edge-control has not read Serve since); its wake then answers
        in a Serve call's time. The wake goes on after a False."""
        self.wake(model, region)
        task = self._wakes[(model, region)]
        if not task.done() and within_s > 0:
            timed_out = asyncio.get_running_loop().create_future()
            timer = self._clock.call_later(within_s, partial(_settle, timed_out))
            try:
                await asyncio.wait([task, timed_out], return_when=asyncio.FIRST_COMPLETED)
            finally:
                timer.cancel()
                timed_out.cancel()
        return task.done() and not task.cancelled() and task.exception() is None

    def _woken(self, model: str, region: str, task: asyncio.Task[Any]) -> None:
        """A wake answered: its replica has started (on a warm pool worker, which to replace)."""
        _quietly(task)
        if not task.cancelled() and task.exception() is None:
            self.estimate.wake_answered(model, region, replica_ready_at=task.result())
            self._replace_taken_worker()
        else:
            self.estimate.wake_failed(model, region)

    def _replace_taken_worker(self) -> None:
        """A replica started on a warm pool worker: the pool tops itself up (fire and forget)."""
        if self._warm_pool is not None:
            self._warm_pool.top_up()

    # ---- sharing with edge-control ------------------------------------------------------------

    async def ready(self) -> None:
        """Start syncing with edge-control if not yet; the first request waits for one snapshot
        (FIRST_SYNC_TIMEOUT_S at most), so it routes from real state."""
        if self._control is None or self._synced is None:
            return
        if self._syncer is None or self._syncer.done():
            self._syncer = asyncio.get_running_loop().create_task(self._sync_forever())
        if not self._synced.is_set():
            try:
                await asyncio.wait_for(self._synced.wait(), FIRST_SYNC_TIMEOUT_S)
            except TimeoutError:
                log.warning("no region state from edge-control yet: routing by distance")

    async def sync(self) -> bool:
        """Hand edge-control this replica's outcomes and demand; take every pool's state in
        return. True when there was something to hand over or the pools' state changed."""
        if self._control is None:
            return False  # no edge-control: nothing to share
        outcomes, self._outcomes = self._outcomes, []
        demand, self._demand = self._demand, {}
        try:
            snapshot = await self._control.sync(outcomes, demand)
        except BaseException:
            self._outcomes[:0] = outcomes  # reported on the next sync instead
            for key, count in demand.items():
                self._demand[key] = self._demand.get(key, 0) + count
            raise
        changed = snapshot != self.snapshot
        self.snapshot = snapshot
        if self._synced is not None:
            self._synced.set()
        return bool(outcomes or demand) or changed

    async def _sync_forever(self) -> None:
        """Sync every 0.5 s while requests come or wait on a region, or the pools change;
        doubling the wait up to 4 s while all is still (each sync costs this replica and
        edge-control a Serve call). The next request ends an idle wait (WOKEN_SYNC_DELAY_S after
        it)."""
        while True:
            self._sync_now.clear()  # a request from here on ends the wait for the next sync
            busy = False
            try:
                busy = await self.sync()
            except Exception:  # noqa: BLE001 - a missed sync is retried; routing goes on
                log.warning("region sync with edge-control failed", exc_info=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.sync_pacer.after_read(busy)):
                    await self._sync_now.wait()
                await asyncio.sleep(WOKEN_SYNC_DELAY_S)  # woken by a request

    def keep_fresh(self) -> None:
        """An attempt is waiting on a region (whose loss it must see): sync at the fast pace."""
        self._wake_syncer()

    def _wake_syncer(self) -> None:
        if self.sync_pacer.idle:
            self._sync_now.set()


class RegionWatch:
    """One attempt's view of the region it waits on: a cold region tells the request's notice (a
    stream then says it is warming), and `lost`, looked at while the attempt runs, says when to
    leave it.

    A region warm when the attempt started and cold now lost its replicas to a dead node, or
    Serve scaled it to zero before the snapshot that said warm (edge-control's, up to an idle sync
    old); then the request queued there wakes it in a cold start. Leaving at once suits the first;
    in the second it woke a farther cold region besides (two cold starts, the request on the
    later one). So the region is left at once for a warm one only, else once it stayed cold
    LOST_AFTER_COLD_STARTS of the model's expected cold starts."""

    def __init__(
        self,
        pools: RegionPools,
        clock: EdgeClock,
        model: str,
        region: str,
        notice: ColdStartNotice,
    ):
        self.model, self.region = model, region
        self._pools, self._clock, self._notice = pools, clock, notice
        self.was_warm = pools.pools(model)[region].warm
        self._cold_since: float | None = None  # when this attempt first saw it cold
        if not self.was_warm:
            self._tell_notice()

    def _tell_notice(self) -> None:
        expected = partial(self._pools.expected_ready_s, self.model, self.region)
        self._notice.waiting_on(self.region, expected)

    def lost(self) -> bool:
        """Has the region become unusable since the attempt started there?"""
        views = self._pools.pools(self.model)
        view = views[self.region]
        if view.ejected:
            return True
        if view.warm or not self.was_warm:
            self._cold_since = None
            return False
        if any(other.warm for name, other in views.items() if name != self.region):
            return True
        now = self._clock.now()
        if self._cold_since is None:
            self._cold_since = now
            self._tell_notice()  # the request now waits for a cold start
        cold_start_s = self._pools.cold_start_ms(self.model) / 1000.0
        return now - self._cold_since > LOST_AFTER_COLD_STARTS * cold_start_s


async def _await(response: Awaitable[Any]) -> Any:
    return await response


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _quietly(task: asyncio.Task[Any]) -> None:
    """A wake request that failed or timed out says nothing: the next detour wakes again."""
    if not task.cancelled():
        task.exception()
