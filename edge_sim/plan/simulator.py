"""The planner's event loop: a trace's requests in time order through the router's routing code
and a model of each deployment's replica pool, on a virtual clock.

One request: entry colo and failover list by `ColoRanker.rank`, its regions by
`edge_sim.regions.plan_regions` on a snapshot of the `RegionBoard` (as a router routes from
edge-control's latest snapshot), then attempts in order: a region in an outage fails it (the
board's outlier detection sees it, as live), a pool whose queue is full sheds it back (the board
marks it saturated), a pool at zero starts a replica (Serve's cold-start fast path) and the
request waits for it. Each pool (`pool.ReplicaPool`) is `replicas x max_ongoing_requests`
slots, first come first served, with a fixed service time per model. Serve's autoscaler
(`ServeAutoscaler`) runs every metrics interval on each busy pool; the board snapshot is
refreshed every `sync_s`.

Colo drills are the router's own: `ColoFault` plans (the config's `edge.faults` and the run's
own) in an `edge_sim.faults.FaultBook` on the virtual clock; a colo down or slowed changes the
ranking, one failing a share of requests passes them to the next entry colo (a seeded draw), and
a request no entry colo takes is shed, as the dispatcher does.

Routing decisions are cached exactly (`route_plans`); what the run counts is in `accounting`,
what it is given besides the world and the trace in `settings`.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Mapping, Sequence
from heapq import heappop, heappush, heapreplace
from typing import cast

import numpy as np

from edge_sim.faults import ColoFault, FaultBook
from edge_sim.plan.accounting import RunAccounts, ServedChunk, SimulationResult
from edge_sim.plan.autoscaler import PoolSpec
from edge_sim.plan.events import DRILL, OUTAGE, POLICY, READY, SYNC, TICK, TIMER, EventQueue
from edge_sim.plan.pool import ReplicaPool
from edge_sim.plan.route_plans import Drills, RoutePlan, RoutePlans
from edge_sim.plan.serve_controller import ServeController
from edge_sim.plan.settings import FloorPolicy, RegionOutage, SimSettings
from edge_sim.plan.trace import Trace, TraceChunk
from edge_sim.plan.world import World
from edge_sim.region_board import Outcome, RegionBoard


class Simulator:
    """One run: `Simulator(world, specs, settings).run(trace)`. Not reusable."""

    def __init__(
        self,
        world: World,
        specs: Mapping[str, PoolSpec] | Mapping[tuple[str, str], PoolSpec],
        settings: SimSettings | None = None,
        *,
        outages: Sequence[RegionOutage] = (),
        colo_faults: Mapping[str, Sequence[ColoFault]] | None = None,
        policy: FloorPolicy | None = None,
    ):
        """colo_faults: drills set at t = 0 (their start_after_s: when into the trace), on top
        of the config's `edge.faults`."""
        self.world = world
        self.settings = settings or SimSettings()
        self._specs = specs
        self._outages = tuple(outages)
        self._policy = policy
        unknown = sorted({o.region for o in self._outages} - set(world.region_names))
        if unknown:
            raise ValueError(f"outages: unknown regions {unknown}")
        self._colo_faults = {colo: list(faults) for colo, faults in world.edge.faults.items()}
        for colo, faults in (colo_faults or {}).items():
            self._colo_faults.setdefault(colo, []).extend(faults)
        unknown = sorted(set(self._colo_faults) - set(world.ranker.colo_ids))
        if unknown:
            raise ValueError(f"colo faults: unknown colos {unknown}")

    def _spec(self, model: str, region: str) -> PoolSpec:
        specs = self._specs
        for key in ((model, region), model):
            if key in specs:
                return specs[key]  # type: ignore[index]
        raise ValueError(f"no deployment spec for model {model!r} in region {region!r}")

    def run(self, trace: Trace) -> SimulationResult:
        started = time.perf_counter()
        self._start(trace)
        for chunk in trace.chunks():
            self._serve_chunk(chunk)
        self._run_events_until(trace.duration_s)
        return self._result(trace, started)

    def _start(self, trace: Trace) -> None:
        """The run's state at t = 0: pools deployed with replicas have them up, the board's
        snapshot taken, outages, floor policy and drills on the event queue."""
        world, settings = self.world, self.settings
        models, regions = trace.models, world.region_names
        self._now = 0.0
        self._board = RegionBoard(
            models,
            regions,
            world.edge.region_policy,
            settings.default_cold_start_ms,
            clock=lambda: self._now,
        )
        self._pools = pools = {
            (m, r): ReplicaPool(
                i * len(regions) + j,
                m,
                r,
                self._spec(m, r),
                settings.cold_start_s.get(m, settings.default_cold_start_s),
            )
            for i, m in enumerate(models)
            for j, r in enumerate(regions)
        }
        self._plans = RoutePlans(
            world,
            models,
            trace.origins,
            pools,
            default_cold_start_ms=settings.default_cold_start_ms,
            failover_attempts=settings.failover_attempts,
            cached=settings.cache_routes,
        )
        region_index = {r: i for i, r in enumerate(regions)}
        self._accounts = RunAccounts(
            [region_index[p.region] for p in pools.values()],
            len(regions),
            trace.duration_s,
            settings.timeline_s,
        )
        self._events = EventQueue()
        self._sync_pending = False
        self._measure_from = settings.measure_from_s
        self._control = ServeController(
            self._events,
            # Serve's controller samples every deployment's metrics on one beat.
            min(p.spec.autoscaling_config.metrics_interval_s for p in pools.values()),
            self._measure_from,
            self._replicas_changed,
        )
        self._dirty: dict[str, set[str]] = {m: set(regions) for m in models}
        self._demand: dict[tuple[str, str], int] = {}
        self._service_s = np.array(
            [settings.service_ms.get(m, settings.default_service_ms) / 1000 for m in models]
        )
        self._rng = np.random.default_rng(settings.seed)
        for pool in pools.values():
            start = pool.spec.autoscaling_config.start_replicas
            if start:
                # Deployed with replicas: they are up when the trace starts.
                self._control.set_target(pool, start, -pool.cold_start_s)
                for ready in list(pool.pending):
                    self._control.ready(pool, ready)
        self._events.clear()
        self._control.tick_pending = self._sync_pending = False
        for pool in pools.values():
            self._control.heat(pool, 0.0)
        self._sync(0.0)
        for outage in self._outages:
            self._events.push(outage.start_s, OUTAGE, (outage.region, True))
            self._events.push(outage.start_s + outage.duration_s, OUTAGE, (outage.region, False))
        if self._policy is not None:
            self._events.push(0.0, POLICY, None)
        self._faults = FaultBook(
            world.ranker.colo_ids, lambda: self._now, random.Random(f"{world.edge.seed}:faults")
        )
        for colo, plans in self._colo_faults.items():
            for fault in plans:
                scheduled = self._faults.add(colo, fault)
                self._events.push(scheduled.starts_at, DRILL, None)
                if math.isfinite(scheduled.ends_at):
                    self._events.push(scheduled.ends_at, DRILL, None)
        self._apply_drills()

    def _serve_chunk(self, chunk: TraceChunk) -> None:
        """A chunk of the trace's requests, in arrival order, events in between."""
        times = chunk.t_s.tolist()
        origin_ids = chunk.origin.tolist()
        model_ids = chunk.model.tolist()
        service = self._service_s[chunk.model]
        if self.settings.service_sigma > 0:
            service = service * self._rng.lognormal(0.0, self.settings.service_sigma, len(times))
        service_time = service.tolist()
        served = ServedChunk()
        events, plans, accounts = self._events, self._plans, self._accounts
        for i, now in enumerate(times):
            if events and events[0][0] <= now:
                self._run_events_until(now)
            self._now = now
            m = model_ids[i]
            origin = origin_ids[i]
            accounts.arrivals += 1
            entry_k = 0
            if plans.drill.failing:
                # A colo drilled to fail a share passes those requests to the next one.
                entries = plans.entries(origin, m)
                while entry_k < len(entries) and self._faults.should_fail(entries[entry_k].colo_id):
                    entry_k += 1
            plan = plans.plan(origin, m, entry_k)
            if plan is None:
                if self._measure_from <= now:
                    model = plans.models[m]
                    accounts.shed(model, plans.home_of(origin, model))
                continue
            self._serve(i, now, plans.models[m], plan, service_time[i], served)
        self._accounts.fold(served, chunk.t_s)

    def _serve(
        self, i: int, now: float, model: str, plan: RoutePlan, service_s: float, served: ServedChunk
    ) -> None:
        """Request `i` of its chunk through its plan's attempts: a region down fails it, a full
        queue sheds it back, the first pool with room (or at zero, starting) serves it."""
        attempts, wake, home = plan
        if self._policy is not None:
            key = (model, home)
            self._demand[key] = self._demand.get(key, 0) + 1
        if wake is not None and not wake.slots and not wake.down:
            self._control.set_target(wake, max(1, wake.target), now)
        measured = now >= self._measure_from
        tick_s = self._control.tick_s
        spent_ms = 0.0
        for pool, rtt_ms in attempts:
            if pool.down:
                spent_ms += rtt_ms + self.settings.failed_attempt_ms
                self._report(pool, "failed", now)
                if measured:
                    self._accounts.failed_attempt(pool.model, pool.region)
                continue
            finishing = pool.in_system
            while finishing and finishing[0] <= now:
                heappop(finishing)
            slots = pool.slots
            if not slots:
                # Serve's cold-start fast path: a queued request at zero replicas.
                self._control.set_target(pool, max(1, pool.target), now)
            elif 0 <= pool.max_queued <= len(finishing) - len(slots):
                spent_ms += rtt_ms
                self._report(pool, "saturated", now)
                continue
            cold = pool.running == 0
            free = slots[0]
            start = free if free > now else now
            finish = start + service_s
            heapreplace(slots, finish)
            heappush(finishing, finish)
            # A request that is over before the controller's next sample is never seen by it:
            # an idle pool stays idle (and off the control loop).
            if not pool.hot and finish >= (int(now / tick_s) + 1) * tick_s:
                self._control.heat(pool, now)
            if now < pool.watch_until:
                self._report(pool, "ok", now)
            if cold:
                self._note_cold_start(pool, (start - now) * 1000.0)
            if measured:
                if cold:
                    pool.stats.cold += 1
                elif start > now:
                    pool.stats.queued += 1
                served.served(i, pool.index, spent_ms + rtt_ms + (finish - now) * 1000.0)
            return
        if measured:
            self._accounts.shed(model, home)

    def _result(self, trace: Trace, started: float) -> SimulationResult:
        accounts, settings = self._accounts, self.settings
        for pool in self._pools.values():
            accounts.close_pool(pool.index, pool.stats)
            self._control.account(pool, trace.duration_s)
            pool.stats.timeline.append((trace.duration_s, pool.running, pool.target))
        return SimulationResult(
            models=trace.models,
            regions=self.world.region_names,
            duration_s=trace.duration_s,
            measured_from_s=self._measure_from,
            pools={key: pool.stats for key, pool in self._pools.items()},
            sheds=accounts.sheds,
            failed_attempts=accounts.failed_attempts,
            requests_timeline=accounts.served_timeline,
            timeline_s=settings.timeline_s,
            arrivals=accounts.arrivals,
            wall_s=time.perf_counter() - started,
            route_computations=self._plans.computed,
            route_cache_hits=self._plans.hits,
            cost_per_replica_s={m: settings.gpu_per_replica.get(m, 1.0) for m in trace.models},
        )

    # --- events -------------------------------------------------------------------------

    def _run_events_until(self, until: float) -> None:
        events, demand = self._events, self._demand
        while events and events[0][0] <= until:
            at, _, kind, payload = heapq.heappop(events)
            self._now = at
            if kind == READY:
                ready_pool, ready_at = cast(tuple[ReplicaPool, float], payload)
                self._control.ready(ready_pool, ready_at)
            elif kind == TICK:
                self._control.tick(cast(int, payload))
            elif kind == TIMER:
                idle_pool, token = cast(tuple[ReplicaPool, int], payload)
                if not idle_pool.hot and token == idle_pool.timer_token:
                    idle_pool.scaler.skipped_idle(at, self._control.tick_s, include_now=False)
                    self._control.tick_pool(idle_pool, at)
            elif kind == SYNC:
                self._sync_pending = False
                self._sync(at)
            elif kind == DRILL:
                self._apply_drills()
            elif kind == OUTAGE:
                region, down = cast(tuple[str, bool], payload)
                for outage_pool in self._pools.values():
                    if outage_pool.region == region:
                        outage_pool.down = down
            elif kind == POLICY:
                assert self._policy is not None
                floors = self._policy.floors(at, dict(demand))
                demand.clear()
                for key, pool in self._pools.items():
                    floor = floors.get(key, 0)
                    if floor != pool.floor:
                        pool.floor = floor
                        self._control.heat(pool, at)
                self._events.push(at + self._policy.interval_s, POLICY, None)

    def _apply_drills(self) -> None:
        """The drills active now, as the router's network reads them per request; entry colos
        and plans routed under the previous ones are dropped."""
        effects = self._faults.active_effects()
        drill = Drills(
            down=[colo for colo, e in effects.items() if e.down],
            added_latency_ms={
                c: e.added_latency_ms for c, e in effects.items() if e.added_latency_ms
            },
            failing={colo for colo, e in effects.items() if e.error_rate},
        )
        self._plans.set_drills(drill)

    def _sync(self, now: float) -> None:
        """A router's snapshot refresh: views from the board, plans dropped where they moved."""
        board = self._board
        still: dict[str, set[str]] = {}
        for model, regions in self._dirty.items():
            views = self._plans.refresh(
                model,
                {region: board.pool(model, region) for region in regions},
                board.cold_start_ms(model),
            )
            # Saturation and ejection end on their own time: look again next refresh.
            timed = {
                r
                for r in regions
                if views[r].saturated
                or views[r].ejected
                or now < self._pools[(model, r)].watch_until
            }
            if timed:
                still[model] = timed
        self._dirty = still
        if still:
            self._schedule_sync(now)

    def _mark_dirty(self, model: str, region: str) -> None:
        self._dirty.setdefault(model, set()).add(region)
        self._schedule_sync(self._now)

    def _schedule_sync(self, now: float) -> None:
        """Routers refresh their snapshot every sync_s; refreshes that change nothing skipped."""
        if not self._sync_pending:
            self._sync_pending = True
            sync_s = self.settings.sync_s
            self._events.push((math.floor(now / sync_s + 1e-9) + 1) * sync_s, SYNC, None)

    def _report(self, pool: ReplicaPool, kind: str, now: float) -> None:
        self._board.report([Outcome(pool.model, pool.region, kind)])  # type: ignore[arg-type]
        if kind == "failed":
            health = self.world.edge.region_policy.health
            pool.watch_until = now + health.window_s + health.max_ejection_s
        self._mark_dirty(pool.model, pool.region)

    def _note_cold_start(self, pool: ReplicaPool, waited_ms: float) -> None:
        if waited_ms > 0:
            self._board.report([Outcome(pool.model, pool.region, "ok", cold_start_ms=waited_ms)])
            self._mark_dirty(pool.model, pool.region)

    # --- replicas -----------------------------------------------------------------------

    def _replicas_changed(self, pool: ReplicaPool) -> None:
        self._board.set_replicas({key: p.running for key, p in self._pools.items()})
        self._mark_dirty(pool.model, pool.region)
