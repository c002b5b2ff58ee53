"""The router's edge layer. A request enters at its nearest colo (simulated: client->colo RTT from
geography) and is served by a region: one real replica pool per model and region, chosen from
the pools' shared real state (edge_sim.regions.plan_regions). The RTT to that region is acted
out; a region that fails (a real error from its replicas, a dead actor, a time-out) makes the
request fail over to the next one; back-pressure (Serve's queue full) spills it to the next one
without counting against the region."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from deployments.errors import (
    BadHeaderValueError,
    OverloadedError,
    QueueFullError,
    ServingError,
)
from deployments.servers.base import Reply
from deployments.serving.calls import as_serving_error
from edge_sim.geo import BadHeaderError, ClientLocation
from edge_sim.network import EdgeNetwork
from edge_sim.region_board import BoardSnapshot, Outcome, OutcomeKind
from edge_sim.regions import PoolView, RegionMap, RegionPlan, RegionPolicy, plan_regions
from edge_sim.routing import NoColoAvailableError, RouteCandidate

T = TypeVar("T")
Handle = Any  # a DeploymentHandle (or a test double with the same methods)
log = logging.getLogger("ray.serve")
SYNC_INTERVAL_S = 0.5
FIRST_SYNC_TIMEOUT_S = 3.0
LOST_CHECK_S = 0.25  # how often a running attempt looks whether its region is still there


class RegionLostError(Exception):
    """The region an attempt waits on lost its replicas or was ejected meanwhile."""


@dataclass
class EdgeTrace:
    """Where a request went and why; becomes the x-edge-* response headers."""

    colo: str
    region: str
    rtt_ms: float
    reason: str
    tried: list[str] = field(default_factory=list)  # drilled colos passed, then regions tried
    cold_start_ms: float | None = None
    cache: str | None = None
    client: ClientLocation | None = None
    cold_start_phases: dict[str, float | None] | None = None  # of the replica it waited on
    skipped_colos: tuple[str, ...] = ()  # entry colos whose drill failed the request
    failed_regions: tuple[str, ...] = ()  # regions that failed it (5xx, time-out, lost)

    def headers(self) -> dict[str, str]:
        headers = {
            "x-edge-colo": self.colo,
            "x-edge-region": self.region,
            "x-edge-rtt-ms": f"{self.rtt_ms:.1f}",
            "x-edge-route-reason": self.reason,
            "x-edge-cold-start": "1" if self.cold_start_ms is not None else "0",
        }
        if self.reason == "failover":
            headers["x-edge-failover"] = ",".join(self.tried)
        if self.cold_start_ms is not None:
            headers["x-edge-cold-start-ms"] = f"{self.cold_start_ms:.0f}"
        if self.cache is not None:
            headers["x-edge-cache"] = self.cache
        return headers


class RegionPools:
    """This router replica's side of the shared region state: the handle of every (model,
    region) pool, the latest snapshot from edge-control, and what this replica saw since (its
    outcomes go to edge-control on the next sync; its own back-pressure counts at once)."""

    def __init__(
        self,
        handles: Mapping[str, Mapping[str, Handle]],
        policy: RegionPolicy,
        default_cold_start_ms: float,
        control: Any = None,
        clock: Callable[[], float] = time.monotonic,
        after_cold_start: Callable[[], None] | None = None,
    ):
        """after_cold_start: called once a cold start has been served or a woken pool has its
        replica (which took a warm pool worker: the pool is asked to replace it now, not at its
        next check)."""
        self.handles = {model: dict(by_region) for model, by_region in handles.items()}
        self.policy = policy
        self._default_cold_start_ms = default_cold_start_ms
        self._control = control
        self._clock = clock
        self.snapshot = BoardSnapshot({}, {})
        self._synced = asyncio.Event() if control is not None else None
        self._full_until: dict[tuple[str, str], float] = {}
        self._outcomes: list[Outcome] = []
        self._wakes: dict[tuple[str, str], asyncio.Task[Any]] = {}
        self._syncer: asyncio.Task[None] | None = None
        self.last_cold_start: dict[str, dict[str, Any]] = {}
        self._after_cold_start = after_cold_start

    def handle(self, model: str, region: str) -> Handle:
        return self.handles[model][region]

    def serving_handle(self, model: str) -> Handle:
        """A handle for calls outside the edge (the moderation gate's): a warm region's if any,
        so a check never waits on a cold start another region could spare."""
        regions = self.handles[model]
        warm = [r for r in regions if self.snapshot.pool(model, r).warm]
        return regions[warm[0] if warm else next(iter(regions))]

    def pools(self, model: str) -> dict[str, PoolView]:
        now = self._clock()
        views = {}
        for region in self.handles[model]:
            view = self.snapshot.pool(model, region)
            if self._full_until.get((model, region), 0.0) > now and not view.saturated:
                view = PoolView(view.running, view.ejected, saturated=True)
            views[region] = view
        return views

    def lost(self, model: str, region: str, was_warm: bool) -> bool:
        """Has the region become unusable since an attempt started there?"""
        view = self.snapshot.pool(model, region)
        return view.ejected or (was_warm and not view.warm)

    def cold_start_ms(self, model: str) -> float:
        return self.snapshot.cold_start_ms.get(model, self._default_cold_start_ms)

    def report(
        self, model: str, region: str, kind: OutcomeKind, cold_ms: float | None = None
    ) -> None:
        """How an attempt went; back-pressure also marks the pool full here at once."""
        if kind == "saturated":
            self._full_until[(model, region)] = self._clock() + self.policy.saturation_hold_s
        if self._control is not None:
            self._outcomes.append(Outcome(model, region, kind, cold_ms))

    def note_cold_start(self, model: str, record: dict[str, Any]) -> None:
        """A request of `model` waited for a replica to start: `record` is /readyz's account."""
        self.last_cold_start[model] = record
        if self._after_cold_start is not None:
            self._after_cold_start()

    def wake(self, model: str, region: str) -> None:
        """Send the cold pool one request that queues until Serve has started a replica for it
        (Serve scales a deployment up from zero for queued requests); one at a time per pool."""
        key = (model, region)
        if key in self._wakes and not self._wakes[key].done():
            return
        handle = self.handle(model, region)
        task = asyncio.get_running_loop().create_task(
            asyncio.wait_for(_await(handle.wake.remote()), self.policy.wake_timeout_s)
        )
        task.add_done_callback(self._woken)
        self._wakes[key] = task

    def _woken(self, task: asyncio.Task[Any]) -> None:
        """A wake answered: its replica has started (on a warm pool worker, which to replace)."""
        _quietly(task)
        if not task.cancelled() and task.exception() is None and self._after_cold_start:
            self._after_cold_start()

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

    async def sync(self) -> None:
        """Hand edge-control this replica's outcomes; take every pool's state in return."""
        outcomes, self._outcomes = self._outcomes, []
        try:
            self.snapshot = await self._control.sync.remote(outcomes)
        except BaseException:
            self._outcomes[:0] = outcomes  # reported on the next sync instead
            raise
        if self._synced is not None:
            self._synced.set()

    async def _sync_forever(self) -> None:
        while True:
            try:
                await self.sync()
            except Exception:  # noqa: BLE001 - a missed sync is retried; routing goes on
                log.warning("region sync with edge-control failed", exc_info=True)
            await asyncio.sleep(SYNC_INTERVAL_S)


async def _await(response: Awaitable[Any]) -> Any:
    return await response


def _quietly(task: asyncio.Task[Any]) -> None:
    """A wake request that failed or timed out says nothing: the next detour wakes again."""
    if not task.cancelled():
        task.exception()


class EdgeDispatcher(Generic[T]):
    """Runs one model call through the edge: entry colo, region plan, RTT, call, fail over."""

    def __init__(
        self,
        network: EdgeNetwork,
        regions: RegionMap,
        pools: RegionPools,
        max_attempts: int,
        max_extra_rtt_ms: float | None = None,
    ):
        self.network = network
        self.regions = regions
        self.pools = pools
        self.max_attempts = max_attempts
        self.max_extra_rtt_ms = max_extra_rtt_ms

    def plan(
        self, model: str, headers: Mapping[str, str], client_ip: str | None
    ) -> tuple[RouteCandidate, list[str], ClientLocation, RegionPlan]:
        """(entry colo, colos skipped on the way, client, regions in order). A colo drilled
        down is not an entry point; one drilled to fail a share of requests passes those on
        to the next colo (the colos are simulated: this is where their faults act)."""
        try:
            colos = self.network.route(model, headers, client_ip)
        except BadHeaderError as exc:
            raise BadHeaderValueError(exc.message, header=exc.header) from None
        except NoColoAvailableError as exc:
            raise OverloadedError(exc.message, retry_after_s=5) from None
        skipped = []
        for entry in colos.candidates:
            if not self.network.should_fail(entry.colo_id):
                break
            skipped.append(entry.colo_id)
        else:
            raise OverloadedError(
                f"every colo near the client failed the request ({','.join(skipped)})",
                retry_after_s=1,
            )
        reachable = [
            (region, entry.rtt_ms + backhaul_ms)
            for region, backhaul_ms in self.regions.from_colo(entry.colo_id)
            if region in self.pools.handles[model]
        ]
        plan = plan_regions(
            reachable,
            self.pools.pools(model),
            cold_start_ms=self.pools.cold_start_ms(model),
            max_extra_rtt_ms=self.max_extra_rtt_ms,
            max_candidates=self.max_attempts,
        )
        return entry, skipped, colos.client, plan

    async def nearest(
        self, model: str, headers: Mapping[str, str], client_ip: str | None
    ) -> EdgeTrace:
        """The trace of an answer the entry colo gives from its cache: the client->colo RTT only."""
        entry, _, client, _ = self.plan(model, headers, client_ip)
        await asyncio.sleep(self.network.delay_s(entry))
        return EdgeTrace(
            entry.colo_id,
            self.regions.home(entry.colo_id),
            entry.rtt_ms,
            "nearest",
            [],
            client=client,
        )

    async def dispatch(
        self,
        model: str,
        headers: Mapping[str, str],
        client_ip: str | None,
        call: Callable[[Handle], Awaitable[T]],
        reply_of: Callable[[T], Reply[Any]],
        deadline_s: float,
    ) -> tuple[T, EdgeTrace]:
        """`call(handle)` runs the request on one region's deployment handle."""
        await self.pools.ready()
        entry, skipped, client, plan = self.plan(model, headers, client_ip)
        if plan.wake is not None:
            self.pools.wake(model, plan.wake)
        arrived_at = time.time()
        deadline = time.monotonic() + deadline_s
        tried: list[str] = list(skipped)
        failed_regions: list[str] = []
        failed, spilled = bool(skipped), False
        last_error: ServingError | None = None
        # Fewer regions than attempts (one, without `regions`): the rest retry them in order;
        # Serve routes a retry to another replica of the pool, or a restarted one.
        candidates = [plan.candidates[i % len(plan.candidates)] for i in range(self.max_attempts)]
        for index, candidate in enumerate(candidates):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # A hung region gets its share of the deadline, not all of it: the rest can still try.
            attempt_s = remaining / (len(candidates) - index)
            region = candidate.region
            tried.append(region)
            try:
                result = await self._watched(
                    model, region, self._attempt(model, candidate.rtt_ms, region, call), attempt_s
                )
            except QueueFullError as error:
                self.pools.report(model, region, "saturated")  # back-pressure: not a failure
                spilled, last_error = True, error
                continue
            except ServingError as error:
                if error.status < 500:
                    raise  # the client's mistake, not the region's: no failover
                self.pools.report(model, region, "failed")
                failed, last_error = True, error
                failed_regions.append(region)
                continue
            except (TimeoutError, RegionLostError) as error:
                self.pools.report(model, region, "failed")
                failed = True
                failed_regions.append(region)
                last_error = OverloadedError(
                    str(error) or f"region {region} did not answer in time", retry_after_s=1
                )
                continue
            reply = reply_of(result)
            cold_ms = _cold_start_ms(reply, arrived_at)
            self.pools.report(model, region, "ok", cold_ms)
            if cold_ms is not None:
                self._note_cold_start(model, reply, cold_ms)
            reason = candidate.reason
            if failed:
                reason = "failover"
            elif spilled:
                reason = "spillover"
            trace = EdgeTrace(
                entry.colo_id,
                region,
                candidate.rtt_ms,
                reason,
                tried,
                cold_ms,
                client=client,
                cold_start_phases=(
                    reply.phases.as_dict() if cold_ms is not None and reply.phases else None
                ),
                skipped_colos=tuple(skipped),
                failed_regions=tuple(failed_regions),
            )
            return result, trace
        if last_error is not None:
            raise last_error
        raise OverloadedError(f"no region could take a {model} request in time", retry_after_s=1)

    async def _watched(self, model: str, region: str, attempt: Awaitable[T], timeout_s: float) -> T:
        """Run an attempt until it ends, times out, or its region is lost meanwhile: its replicas
        gone (a killed node: Serve holds the request until a replica that cannot be placed
        starts) or ejected on other requests' failures. A lost attempt fails over at once.
        A timeout scope and a timer, not a Task per attempt (the router's fast path)."""
        loop = asyncio.get_running_loop()
        was_warm = self.pools.pools(model)[region].warm
        lost = False
        timer: asyncio.TimerHandle | None = None

        def look(scope: asyncio.Timeout) -> None:
            nonlocal lost, timer
            if self.pools.lost(model, region, was_warm):
                lost = True
                scope.reschedule(loop.time())  # end the attempt now
            else:
                timer = loop.call_later(LOST_CHECK_S, look, scope)

        try:
            async with asyncio.timeout(timeout_s) as scope:
                timer = loop.call_later(LOST_CHECK_S, look, scope)
                return await attempt
        except TimeoutError:
            if lost:
                raise RegionLostError(f"region {region} lost its {model} replicas") from None
            raise
        finally:
            if timer is not None:
                timer.cancel()

    async def _attempt(
        self, model: str, rtt_ms: float, region: str, call: Callable[[Handle], Awaitable[T]]
    ) -> T:
        delay_s = self.network.delay_for_rtt_s(rtt_ms)
        if delay_s > 0:  # sleep(0) would still cost a round of the event loop
            await asyncio.sleep(delay_s)
        try:
            return await call(self.pools.handle(model, region))
        except ServingError:
            raise
        except Exception as exc:  # noqa: BLE001 - Ray's errors become the client-visible one
            raise as_serving_error(exc) from None

    def _note_cold_start(self, model: str, reply: Reply[Any], waited_ms: float) -> None:
        self.pools.note_cold_start(
            model,
            {
                "at_unix": time.time(),
                "wait_ms": waited_ms,
                "replica_load_s": reply.replica_load_s,
                "phases": reply.phases.as_dict() if reply.phases else None,
            },
        )


def _cold_start_ms(reply: Reply[Any], arrived_at: float) -> float | None:
    """The wait for a replica that became ready after the request arrived, in ms."""
    waited_s = reply.replica_ready_at - arrived_at
    return waited_s * 1000.0 if waited_s > 0 else None
