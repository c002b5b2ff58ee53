"""The edge dispatcher: a model call enters at the client's nearest colo and is run by a region
chosen from the pools' shared real state (edge_sim.regions.plan_regions). The RTT to that region
is acted out; a region that fails (a real error from its replicas, a dead actor, a time-out) makes
the request fail over to the next one; back-pressure (Serve's queue full) spills it to the next one
without counting against the region. The wait limits (ingress/edge/waiting.py) bound it: with
`rejectIfBusy` only a free warm region is tried, and a wait budget ends it with the expected
wake-up as its Retry-After."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from functools import partial
from typing import Protocol

from deployments.errors import (
    BadHeaderValueError,
    BusyError,
    OverloadedError,
    QueueFullError,
    ServingError,
    WaitBudgetExceededError,
)
from deployments.ingress.edge.calls import AnyCall, CallResult
from deployments.ingress.edge.clock import EdgeClock, SystemClock, Timer
from deployments.ingress.edge.fair_queue import FairGates, KeyedRequest
from deployments.ingress.edge.pools import RegionPools, RegionWatch
from deployments.ingress.edge.trace import EdgeTrace
from deployments.ingress.edge.waiting import BUSY_MESSAGE, ColdStartNotice, WaitLimits
from deployments.observability import RequestTelemetry
from edge_sim.geo import BadHeaderError, ClientLocation
from edge_sim.network import EdgeNetwork
from edge_sim.regions import RegionCandidate, RegionMap, RegionPlan, plan_regions
from edge_sim.routing import NoColoAvailableError, RouteCandidate

LOST_CHECK_S = 0.25  # how often a running attempt looks whether its region is still there
# How long a rejectIfBusy request with no warm region waits for its nearest region's wake: a
# replica already up answers in a Serve call's milliseconds; a cold start takes seconds.
BUSY_PROBE_S = 0.2


class RegionLostError(Exception):
    """The region an attempt waits on lost its replicas or was ejected meanwhile."""


class ClientOrigin(Protocol):
    """What the edge plans a request's route by: where its client is and how long it may wait."""

    @property
    def location_headers(self) -> Mapping[str, str]: ...

    @property
    def client_ip(self) -> str | None: ...

    @property
    def wait_limits(self) -> WaitLimits: ...


class EdgeRequest(ClientOrigin, KeyedRequest, Protocol):
    """All the edge reads of a request's scope, as one object: its origin, its key (for the
    fair queue), the telemetry told
    where the request went, and the notice told when an attempt waits for a cold replica. The
    router's RequestContext (deployments.ingress.serving.context) is one; the edge does not
    import it, as it imports nothing of the services above it."""

    @property
    def telemetry(self) -> RequestTelemetry: ...

    @property
    def warming(self) -> ColdStartNotice: ...


class EdgeDispatcher:
    """Runs one model call through the edge: entry colo, region plan, RTT, call, fail over; tells
    the request's telemetry where it went."""

    def __init__(
        self,
        network: EdgeNetwork,
        regions: RegionMap,
        pools: RegionPools,
        *,
        max_attempts: int,
        deadline_s: float,
        max_extra_rtt_ms: float | None = None,
        clock: EdgeClock | None = None,
        busy_probe_s: float = BUSY_PROBE_S,
        gate: FairGates | None = None,
        attempt_timeouts_s: Mapping[str, float] | None = None,
    ):
        """`deadline_s`: per request, across failovers and cold starts. `gate`: the fair queue
        between keys a request of a gated model waits in while the model is full (None: none).
        `attempt_timeouts_s`: per model, how long a warm region may take before the attempt
        fails over (models absent: each attempt its share of the deadline)."""
        self.network = network
        self.regions = regions
        self.pools = pools
        self.max_attempts = max_attempts
        self.deadline_s = deadline_s
        self.max_extra_rtt_ms = max_extra_rtt_ms
        self.clock = clock or SystemClock()
        self.busy_probe_s = busy_probe_s
        self.gate = gate
        self.attempt_timeouts_s = dict(attempt_timeouts_s or {})

    def plan(
        self, model: str, origin: ClientOrigin
    ) -> tuple[RouteCandidate, list[str], ClientLocation, RegionPlan]:
        """(entry colo, colos skipped on the way, client, regions in order). A colo drilled
        down is not an entry point; one drilled to fail a share of requests passes those on
        to the next colo (the colos are simulated: this is where their faults act)."""
        try:
            colos = self.network.route(model, origin.location_headers, origin.client_ip)
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
            if region in self.pools.clients[model]
        ]
        plan = plan_regions(
            reachable,
            self.pools.pools(model),
            cold_start_ms=self.pools.cold_start_ms(model),
            max_extra_rtt_ms=self.max_extra_rtt_ms,
            max_candidates=self.max_attempts,
        )
        return entry, skipped, colos.client, plan

    async def nearest(self, model: str, request: EdgeRequest, waited_s: float = 0.0) -> EdgeTrace:
        """The trace of an answer the entry colo gives from its cache (a HIT): the client->colo
        RTT, less the `waited_s` the request already spent there for an identical one's answer."""
        entry, _, client, _ = self.plan(model, request)
        await self.clock.sleep(max(0.0, self.network.delay_s(entry) - waited_s))
        trace = EdgeTrace(
            entry.colo_id,
            self.regions.home(entry.colo_id),
            entry.rtt_ms,
            "nearest",
            [],
            cache="HIT",
            client=client,
        )
        request.telemetry.routed(trace, client)
        return trace

    async def dispatch(
        self,
        model: str,
        request: EdgeRequest,
        call: AnyCall,
    ) -> tuple[CallResult, EdgeTrace]:
        """Run `call` through the regions once the fair queue lets the request in, if its model
        is gated; its slot is held until the reply came, or a stream's end."""
        await self.pools.ready()
        slot = None if self.gate is None else await self.gate.enter(model, request)
        if slot is None:
            return await self._through_regions(model, request, call)
        try:
            result, trace = await self._through_regions(model, request, call)
        except BaseException:
            slot.release()
            raise
        return slot.hold_until_closed(result), trace

    async def _through_regions(
        self,
        model: str,
        request: EdgeRequest,
        call: AnyCall,
    ) -> tuple[CallResult, EdgeTrace]:
        """Run `call` on the client of the region the plan picks, failing over on 5xx, within
        the request's wait limits; its `warming` notice hears when an attempt waits for a cold
        replica, its telemetry where the call went."""
        entry, skipped, client, plan = self.plan(model, request)
        limits = request.wait_limits
        if not limits.warm_only:  # background work (a batch item) neither wakes a region nor
            # counts as demand to pre-warm one for
            self.pools.note_demand(model, self.regions.home(entry.colo_id))
            if plan.wake is not None:
                self.pools.wake(model, plan.wake)
        allowed = await self._within_limits(model, plan.candidates, limits)
        arrived_at = self.clock.unix()
        deadline = self.clock.now() + self.deadline_s
        budget_end = None if limits.max_wait_s is None else self.clock.now() + limits.max_wait_s
        tried: list[str] = list(skipped)
        failed_regions: list[str] = []
        failed, spilled = bool(skipped), False
        last_error: ServingError | None = None
        # Fewer regions than attempts (one, without `regions`): the rest retry them in order;
        # Serve routes a retry to another replica of the pool, or a restarted one.
        candidates = [allowed[i % len(allowed)] for i in range(self.max_attempts)]
        for index, candidate in enumerate(candidates):
            remaining = deadline - self.clock.now()
            if remaining <= 0:
                break
            # A hung region gets its share of the deadline, not all of it: the rest can still try.
            attempt_s = remaining / (len(candidates) - index)
            region = candidate.region
            warm = self.pools.pools(model)[region].warm
            if warm and model in self.attempt_timeouts_s:  # stuck (a reply lost with a node)
                attempt_s = min(attempt_s, self.attempt_timeouts_s[model])
            budget_left_s = None if budget_end is None else budget_end - self.clock.now()
            if budget_left_s is not None and budget_left_s <= 0:
                raise self._past_budget(model, region, limits)
            budget_binds = budget_left_s is not None and budget_left_s < attempt_s
            attempt_s = min(attempt_s, budget_left_s) if budget_left_s is not None else attempt_s
            tried.append(region)
            watch = self.pools.watch(model, region, request.warming)
            try:
                with request.telemetry.overhead.away():  # the RTT and the replica's time
                    result = await self._watched(watch, candidate.rtt_ms, call, attempt_s)
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
                if budget_binds and isinstance(error, TimeoutError):
                    raise self._past_budget(model, region, limits) from None  # not the region's
                self.pools.report(model, region, "failed")
                failed = True
                failed_regions.append(region)
                last_error = OverloadedError(
                    str(error) or f"region {region} did not answer in time", retry_after_s=1
                )
                continue
            reply = result.reply
            cold_ms = _cold_start_ms(reply.replica_ready_at, arrived_at)
            self.pools.report(model, region, "ok", cold_ms)
            phases = None  # of the replica it waited on, if it waited
            if cold_ms is not None:
                phases = reply.phases.as_dict() if reply.phases else None
                self.pools.note_cold_start(
                    model,
                    {
                        "at_unix": self.clock.unix(),
                        "wait_ms": cold_ms,
                        "replica_load_s": reply.replica_load_s,
                        "phases": phases,
                    },
                )
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
                cold_start_phases=phases,
                skipped_colos=tuple(skipped),
                failed_regions=tuple(failed_regions),
            )
            request.telemetry.routed(trace, client)
            return result, trace
        if limits.reject_if_busy and isinstance(last_error, QueueFullError):
            raise BusyError(BUSY_MESSAGE, retry_after_s=last_error.retry_after_s)
        if last_error is not None:
            raise last_error
        raise OverloadedError(f"no region could take a {model} request in time", retry_after_s=1)

    async def _within_limits(
        self, model: str, candidates: tuple[RegionCandidate, ...], limits: WaitLimits
    ) -> tuple[RegionCandidate, ...]:
        """The candidates the request's wait limits allow. `reject_if_busy`: only regions with a
        warm replica and no back-pressure now; none is a 429 (Workers AI's answer), not a wait,
        once the nearest region's wake has had `busy_probe_s` to answer (it has a replica this
        router's snapshot does not show yet: the retry of an earlier refusal, on another router).
        A wait budget shorter than the first region's expected wake-up is a 503 at once, not a
        wait that can only end in one. Either way the region it would have waited on is woken,
        so a retry after the Retry-After finds it warm; `warm_only` wakes nothing."""
        pools = self.pools.pools(model)
        if limits.reject_if_busy:
            free = tuple(
                c for c in candidates if pools[c.region].warm and not pools[c.region].saturated
            )
            nearest = candidates[0].region
            if (
                not free
                and not limits.warm_only
                and not pools[nearest].warm
                and await self.pools.wake_answers(model, nearest, self.busy_probe_s)
            ):
                free = (candidates[0],)
            if not free:
                raise BusyError(BUSY_MESSAGE, retry_after_s=self._retry_after_s(model, candidates))
            candidates = free
        first = candidates[0].region
        if limits.max_wait_s is not None and (
            self.pools.expected_ready_s(model, first) > limits.max_wait_s
        ):
            self._wake_if_cold(model, first)
            raise self._past_budget(model, first, limits)
        return candidates

    def _retry_after_s(self, model: str, candidates: tuple[RegionCandidate, ...]) -> float:
        """When the first of `candidates` that will take a request is expected to: a warm one
        when its back-pressure mark ends, a cold one woken (only those) when its replica is up."""
        pools = self.pools.pools(model)
        ready = [
            self.pools.expected_ready_s(model, c.region)
            for c in candidates
            if pools[c.region].warm or self.pools.waking(model, c.region)
        ]
        if not ready:  # nothing warm, nothing woken (background work): the cold start
            ready = [self.pools.expected_ready_s(model, candidates[0].region)]
        return min(ready)

    def _wake_if_cold(self, model: str, region: str) -> None:
        if not self.pools.pools(model)[region].warm:
            self.pools.wake(model, region)

    def _past_budget(self, model: str, region: str, limits: WaitLimits) -> WaitBudgetExceededError:
        """The request's wait budget ends before `region` could take it: retry when its replica
        is expected up (the cold-start estimate, less what its wake already waited)."""
        ready_in_s = self.pools.expected_ready_s(model, region)
        budget_ms = round((limits.max_wait_s or 0.0) * 1000)
        return WaitBudgetExceededError(
            f"no {model} replica could take the request within its wait budget "
            f"(x-edge-max-wait-ms: {budget_ms}); region {region} expects one in "
            f"{ready_in_s:.1f} s",
            retry_after_s=ready_in_s,
        )

    async def _watched(
        self, watch: RegionWatch, rtt_ms: float, call: AnyCall, timeout_s: float
    ) -> CallResult:
        """Act out the RTT and run the call until it ends, times out, or its region is lost
        meanwhile: its replicas gone (a killed node: Serve holds the request until a replica that
        cannot be placed starts; `RegionWatch.lost` says when) or ejected on other requests'
        failures. A lost attempt fails over at once. A timeout scope and two timers, not a Task
        per attempt (the router's fast path)."""
        loop = asyncio.get_running_loop()
        model, region = watch.model, watch.region
        lost = False
        expiry: Timer | None = None
        check: Timer | None = None

        def end_now(scope: asyncio.Timeout) -> None:
            scope.reschedule(loop.time())

        def look(scope: asyncio.Timeout) -> None:
            nonlocal lost, check
            if watch.lost():
                lost = True
                end_now(scope)
            else:
                self.pools.keep_fresh()  # the next look sees a loss within a sync or so
                check = self.clock.call_later(LOST_CHECK_S, partial(look, scope))

        try:
            async with asyncio.timeout(None) as scope:
                expiry = self.clock.call_later(timeout_s, partial(end_now, scope))
                check = self.clock.call_later(LOST_CHECK_S, partial(look, scope))
                delay_s = self.network.delay_for_rtt_s(rtt_ms)
                if delay_s > 0:  # sleep(0) would still cost a round of the event loop
                    await self.clock.sleep(delay_s)
                return await call.run(self.pools.client(model, region))
        except TimeoutError:
            if lost:
                raise RegionLostError(f"region {region} lost its {model} replicas") from None
            raise
        finally:
            if expiry is not None:
                expiry.cancel()
            if check is not None:
                check.cancel()


def _cold_start_ms(replica_ready_at: float, arrived_at: float) -> float | None:
    """The wait for a replica that became ready after the request arrived, in ms."""
    waited_s = replica_ready_at - arrived_at
    return waited_s * 1000.0 if waited_s > 0 else None
