"""The planner's event loop: a trace's requests in time order through the router's routing code
and a model of each deployment's replica pool, on a virtual clock.

One request: entry colo and failover list by `ColoRanker.rank`, its regions by
`edge_sim.regions.plan_regions` on a snapshot of the `RegionBoard` (as a router routes from
edge-control's latest snapshot), then attempts in order: a region in an outage fails it (the
board's outlier detection sees it, as live), a pool whose queue is full sheds it back (the board
marks it saturated), a pool at zero starts a replica (Serve's cold-start fast path) and the
request waits for it. Each pool is `replicas x max_ongoing_requests` slots, first come first
served, with a fixed service time per model. Serve's autoscaler (`ServeAutoscaler`) runs every
metrics interval on each busy pool; the board snapshot is refreshed every `sync_s`.

Colo drills are the router's own: `ColoFault` plans (the config's `edge.faults` and the run's
own) in an `edge_sim.faults.FaultBook` on the virtual clock; a colo down or slowed changes the
ranking, one failing a share of requests passes them to the next entry colo (a seeded draw), and
a request no entry colo takes is shed, as the dispatcher does.

Routing is cached, exactly: `ColoRanker.rank` is a pure function of (model, client position,
active drills), and `plan_regions` a pure function of (reachable regions, pool views, cold-start
estimate); the planner keeps one plan per (model, origin, entry colo) and drops plans whenever
their inputs change (a snapshot, a drill starting or ending), so a cached decision is the
decision the code would make.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush, heapreplace
from typing import Protocol, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edge_sim.faults import ColoFault, FaultBook
from edge_sim.geo import ClientLocation
from edge_sim.plan.autoscaler import PoolSpec, ServeAutoscaler
from edge_sim.plan.stats import N_BINS, bins_of
from edge_sim.plan.trace import Trace
from edge_sim.plan.world import Origin, World
from edge_sim.region_board import Outcome, RegionBoard
from edge_sim.regions import PoolView, plan_regions
from edge_sim.routing import NoColoAvailableError, RouteCandidate

# Measured defaults (README "Cold start from zero" and the models suite, this 2-core machine):
# zero replicas to the first response through the router with the warm worker pool, p50 per
# model; and the service time of one request at low load.
COLD_START_S = {"moderation": 0.38, "glm": 0.42, "kimi": 0.44, "embedding": 0.49}
COLD_START_NO_WARM_POOL_S = {"moderation": 1.5, "glm": 1.6, "kimi": 1.6, "embedding": 1.7}
SERVICE_MS = {"moderation": 5.0, "embedding": 24.0, "glm": 60.0, "kimi": 60.0}
"""embedding: 42 requests/s from one closed-loop client (models/peers suites, 1 client);
moderation: the in-process classifier, a few ms; chat: TTFT ~16 ms + ~64 tokens at ~1.4k
tokens/s per stream under batching (peers suite, 16 concurrent streams)."""


class SimSettings(BaseModel):
    """What the planner cannot read from serve_config.yaml: measured times and its own knobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cold_start_s: dict[str, float] = Field(default_factory=lambda: dict(COLD_START_S))
    service_ms: dict[str, float] = Field(default_factory=lambda: dict(SERVICE_MS))
    default_cold_start_s: float = Field(default=0.45, gt=0)
    default_service_ms: float = Field(default=30.0, gt=0)
    service_sigma: float = Field(
        default=0.3, ge=0, description="log-normal spread of service times (0: fixed)"
    )
    gpu_per_replica: dict[str, float] = Field(
        default_factory=dict, description="cost units per replica-second (num_gpus); default 1"
    )
    sync_s: float = Field(default=0.5, gt=0, description="how often routers refresh the board")
    failed_attempt_ms: float = Field(default=5.0, ge=0, description="a region that is down")
    failover_attempts: int = Field(default=3, ge=1)
    default_cold_start_ms: float = Field(default=3000.0, gt=0, description="router's estimate")
    measure_from_s: float = Field(default=0.0, ge=0, description="stats from here on")
    timeline_s: float = Field(default=60.0, gt=0, description="bucket of the request timeline")
    cache_routes: bool = True
    seed: int = 0


class RegionOutage(BaseModel):
    """A region whose replicas fail every request for a while (the load tester's drill)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    region: str
    start_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)


class FloorPolicy(Protocol):
    """A custom autoscaling floor (keep-warm schedule, pre-warming): asked every interval_s with
    the requests each (model, home region) received since, answers floors per (model, region)."""

    interval_s: float

    def floors(
        self, now_s: float, demand: Mapping[tuple[str, str], int]
    ) -> Mapping[tuple[str, str], int]: ...


@dataclass(slots=True)
class PoolStats:
    requests: int = 0  # served here (ok)
    cold: int = 0  # of those, waited for a replica that started after they arrived
    queued: int = 0  # waited for a free slot on a running replica
    histogram: list[int] = field(default_factory=lambda: [0] * N_BINS)
    replica_s: float = 0.0
    scale_from_zero: int = 0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (t, running, target)


class _Pool:
    """One deployment's replicas (a model in a region) on the virtual clock."""

    __slots__ = (
        "model", "region", "spec", "scaler", "per_replica", "max_queued", "running", "target",
        "pending", "slots", "in_system", "down", "floor", "stats", "last_t", "cold_start_s",
        "watch_until", "hot", "timer_token", "index",
    )  # fmt: skip

    def __init__(self, index: int, model: str, region: str, spec: PoolSpec, cold_start_s: float):
        self.index = index  # position in the run's pools (rows of its per-chunk tallies)
        self.model, self.region, self.spec = model, region, spec
        self.scaler = ServeAutoscaler(spec.autoscaling_config)
        self.per_replica = spec.max_ongoing_requests
        self.max_queued = spec.max_queued_requests
        self.cold_start_s = cold_start_s
        self.running = 0
        self.target = 0
        self.pending: list[float] = []  # ready times of replicas starting
        self.slots: list[float] = []  # heap: when each replica slot is next free
        self.in_system: list[float] = []  # heap: finish times of admitted requests
        self.down = False
        self.floor = 0
        self.stats = PoolStats()
        self.last_t = 0.0
        self.watch_until = -math.inf  # report successes to the board until then
        self.hot = False  # ticked by the control loop; an idle pool waits on a timer instead
        self.timer_token = 0


@dataclass
class SimulationResult:
    models: tuple[str, ...]
    regions: tuple[str, ...]
    duration_s: float
    measured_from_s: float
    pools: dict[tuple[str, str], PoolStats]
    sheds: dict[tuple[str, str], int]  # (model, home region) -> requests no region took
    failed_attempts: dict[tuple[str, str], int]
    requests_timeline: np.ndarray  # regions x buckets: requests served per bucket
    timeline_s: float
    arrivals: int
    wall_s: float
    route_computations: int
    route_cache_hits: int
    cost_per_replica_s: dict[str, float]

    def cost_units(self, model: str, region: str) -> float:
        return self.pools[(model, region)].replica_s * self.cost_per_replica_s.get(model, 1.0)


@dataclass(frozen=True, slots=True)
class _Drills:
    """The colo drills active now: down, slowed (extra RTT ms), failing a share of requests."""

    down: list[str] = field(default_factory=list)
    added_latency_ms: dict[str, float] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)


def _routing_state(view: PoolView | None) -> tuple[bool, bool, bool]:
    """What plan_regions reads of a pool (a missing view is plan_regions' empty one)."""
    view = view or PoolView()
    return view.warm, view.ejected, view.saturated


def plan_inputs(
    reachable: Sequence[tuple[str, float]],
    views: Mapping[str, PoolView],
    candidates: int,
    budget_ms: float,
) -> Sequence[str]:
    """The regions whose pool views `plan_regions(reachable, views, ...)` depends on: walking
    the reachable regions in order, up to the one where it has `candidates` regions with room
    and its detour scan is settled (the head warm, or past `budget_ms` of extra RTT). A region
    past that cannot change the plan: ejected or full it only drops out of or moves behind a
    list already long enough; warm or cold it is beyond the detour's reach. Conservative (the
    budget's boundary included); every region when no such point is reached."""
    empty = PoolView()
    with_room = 0
    head_rtt: float | None = None
    head_warm = False
    for index, (region, rtt_ms) in enumerate(reachable):
        view = views.get(region, empty)
        if not view.ejected and not view.saturated:
            with_room += 1
            if head_rtt is None:
                head_rtt, head_warm = rtt_ms, view.warm
        settled = head_rtt is not None and (head_warm or rtt_ms - head_rtt > budget_ms)
        if with_room >= candidates and settled:
            return [name for name, _ in reachable[: index + 1]]
    return [name for name, _ in reachable]


_READY, _TICK, _SYNC, _OUTAGE, _POLICY, _TIMER, _DRILL = range(7)


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

    def run(self, trace: Trace) -> SimulationResult:  # noqa: C901 - one loop, kept together
        started = time.perf_counter()
        world, settings = self.world, self.settings
        models, regions = trace.models, world.region_names
        self._now = 0.0
        board = RegionBoard(
            models,
            regions,
            world.edge.region_policy,
            settings.default_cold_start_ms,
            clock=lambda: self._now,
        )
        self._board = board
        pools = {
            (m, r): _Pool(
                i * len(regions) + j,
                m,
                r,
                self._spec(m, r),
                settings.cold_start_s.get(m, settings.default_cold_start_s),
            )
            for i, m in enumerate(models)
            for j, r in enumerate(regions)
        }
        self._pools = pools
        self._model_index = {m: i for i, m in enumerate(models)}
        self._plan_cache: list[dict[int, tuple]] = [{} for _ in models]
        self._entries: dict[int, list[RouteCandidate]] = {}
        # Per model: region -> plan cache slots whose plan read that region's view.
        self._plan_deps: list[dict[str, set[int]]] = [{} for _ in models]
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._tick_pending = self._sync_pending = False
        self._hot: dict[_Pool, None] = {}
        # Serve's controller samples every deployment's metrics on one beat.
        self._tick_s = min(p.spec.autoscaling_config.metrics_interval_s for p in pools.values())
        self._dirty: dict[str, set[str]] = {m: set(regions) for m in models}
        self._views: dict[str, dict[str, PoolView]] = {m: {} for m in models}
        self._cold_ms: dict[str, float] = {}
        measure_from = measured_from = settings.measure_from_s
        self._measure_from = measure_from
        for pool in pools.values():
            start = pool.spec.autoscaling_config.start_replicas
            if start:
                # Deployed with replicas: they are up when the trace starts.
                self._set_target(pool, start, -pool.cold_start_s)
                for ready in list(pool.pending):
                    self._ready(pool, ready)
        self._events.clear()
        self._tick_pending = self._sync_pending = False
        for pool in pools.values():
            self._heat(pool, 0.0)
        self._sync(0.0)
        for outage in self._outages:
            self._push(outage.start_s, _OUTAGE, (outage.region, True))
            self._push(outage.start_s + outage.duration_s, _OUTAGE, (outage.region, False))
        policy = self._policy
        demand: dict[tuple[str, str], int] = {}
        if policy is not None:
            self._push(0.0, _POLICY, None)

        region_index = {r: i for i, r in enumerate(regions)}
        n_buckets = max(1, math.ceil(trace.duration_s / settings.timeline_s))
        served_timeline = np.zeros((len(regions), n_buckets), dtype=np.int64)
        sheds: dict[tuple[str, str], int] = {}
        failed_attempts: dict[tuple[str, str], int] = {}
        plan_cache = self._plan_cache
        model_of = dict(enumerate(models))
        origins = trace.origins
        service_s = [settings.service_ms.get(m, settings.default_service_ms) / 1000 for m in models]
        rng = np.random.default_rng(settings.seed)
        max_extra = world.edge.routing.max_extra_rtt_ms
        attempts_allowed = settings.failover_attempts
        computed = hits = arrivals = 0
        events = self._events
        timeline_s = settings.timeline_s
        failed_ms = settings.failed_attempt_ms
        tick_s = self._tick_s
        cache_routes = settings.cache_routes

        faults = FaultBook(
            world.ranker.colo_ids, lambda: self._now, random.Random(f"{world.edge.seed}:faults")
        )
        for colo, plans in self._colo_faults.items():
            for fault in plans:
                scheduled = faults.add(colo, fault)
                self._push(scheduled.starts_at, _DRILL, None)
                if math.isfinite(scheduled.ends_at):
                    self._push(scheduled.ends_at, _DRILL, None)
        self._faults = faults
        self._apply_drills()
        # Regions from an entry colo, by RTT (RouteCandidate is a frozen value: one per RTT).
        reachable_cache: dict[RouteCandidate, list[tuple[str, float]]] = {}
        entry_slots = world.edge.routing.max_candidates + 1  # k = len(entries): none took it
        entries_cache = self._entries

        def entries_for(origin: int, m: int) -> list[RouteCandidate]:
            """The ranked entry colos of this origin and model under the drills now."""
            key = origin * len(models) + m
            entries = entries_cache.get(key)
            if entries is None:
                o = origins[origin]
                drill = self._drill
                try:
                    entries = world.ranker.rank(
                        model_of[m],
                        ClientLocation(o.lat, o.lon, "header"),
                        unavailable=drill.down,
                        added_latency_ms=drill.added_latency_ms,
                    )
                except NoColoAvailableError:
                    entries = []
                entries_cache[key] = entries
            return entries

        def plan_for(origin: int, m: int, k: int, slot: int | None) -> tuple | None:
            """Attempts (pool, RTT), the pool to wake and the home region, through the k-th
            entry colo; None when there is no such colo (every one drilled down). With a cache
            `slot`, the plan is kept there until a view it read moves."""
            entries = entries_for(origin, m)
            if k >= len(entries):
                return None
            model = model_of[m]
            entry = entries[k]
            reachable = reachable_cache.get(entry)
            if reachable is None:
                reachable = reachable_cache[entry] = [
                    (region, entry.rtt_ms + backhaul_ms)
                    for region, backhaul_ms in world.regions.from_colo(entry.colo_id)
                ]
            views = self._views[model]
            cold_ms = self._cold_ms.get(model, settings.default_cold_start_ms)
            plan = plan_regions(
                reachable,
                views,
                cold_start_ms=cold_ms,
                max_extra_rtt_ms=max_extra,
                max_candidates=attempts_allowed,
            )
            wake = pools[(model, plan.wake)] if plan.wake is not None else None
            attempts = tuple((pools[(model, c.region)], c.rtt_ms) for c in plan.candidates)
            found = attempts, wake, reachable[0][0]
            if slot is not None:
                plan_cache[m][slot] = found
                deps = self._plan_deps[m]
                budget_ms = cold_ms if max_extra is None else max_extra
                for region in plan_inputs(reachable, views, attempts_allowed, budget_ms):
                    deps.setdefault(region, set()).add(slot)
            return found

        # Served requests are tallied per chunk (which request, where, how long) and folded into
        # the histograms and timeline with numpy at the chunk's end: cheaper than per request.
        pool_list = list(pools.values())
        histograms = np.zeros((len(pool_list), N_BINS), dtype=np.int64)
        pool_region = np.array([region_index[p.region] for p in pool_list], dtype=np.int64)
        service_by_model = np.array(service_s)
        for chunk in trace.chunks():
            times = chunk.t_s.tolist()
            origin_ids = chunk.origin.tolist()
            model_ids = chunk.model.tolist()
            service = service_by_model[chunk.model]
            if settings.service_sigma > 0:
                service = service * rng.lognormal(0.0, settings.service_sigma, len(times))
            service_time = service.tolist()
            served_i, served_pool, served_ms = array("q"), array("q"), array("d")
            for i, now in enumerate(times):
                if events and events[0][0] <= now:
                    self._run_events_until(now, demand)
                self._now = now
                m = model_ids[i]
                origin = origin_ids[i]
                arrivals += 1
                entry_k = 0
                if self._drill.failing:
                    # A colo drilled to fail a share passes those requests to the next one.
                    entries = entries_for(origin, m)
                    while entry_k < len(entries) and faults.should_fail(entries[entry_k].colo_id):
                        entry_k += 1
                cache = plan_cache[m]
                slot = origin * entry_slots + entry_k
                plan = cache.get(slot) if cache_routes else None
                if plan is None:
                    plan = plan_for(origin, m, entry_k, slot if cache_routes else None)
                    computed += 1
                    if plan is None:
                        if measured_from <= now:
                            shed = (model_of[m], self._home_of(origins[origin], model_of[m]))
                            sheds[shed] = sheds.get(shed, 0) + 1
                        continue
                else:
                    hits += 1
                attempts, wake, home = plan
                if policy is not None:
                    key = (model_of[m], home)
                    demand[key] = demand.get(key, 0) + 1
                if wake is not None and not wake.slots and not wake.down:
                    self._set_target(wake, max(1, wake.target), now)
                measured = now >= measure_from
                spent_ms = 0.0
                for pool, rtt_ms in attempts:
                    if pool.down:
                        spent_ms += rtt_ms + failed_ms
                        self._report(pool, "failed", now)
                        if measured:
                            k = (pool.model, pool.region)
                            failed_attempts[k] = failed_attempts.get(k, 0) + 1
                        continue
                    finishing = pool.in_system
                    while finishing and finishing[0] <= now:
                        heappop(finishing)
                    slots = pool.slots
                    if not slots:
                        # Serve's cold-start fast path: a queued request at zero replicas.
                        self._set_target(pool, max(1, pool.target), now)
                    elif 0 <= pool.max_queued <= len(finishing) - len(slots):
                        spent_ms += rtt_ms
                        self._report(pool, "saturated", now)
                        continue
                    cold = pool.running == 0
                    free = slots[0]
                    start = free if free > now else now
                    finish = start + service_time[i]
                    heapreplace(slots, finish)
                    heappush(finishing, finish)
                    # A request that is over before the controller's next sample is never
                    # seen by it: an idle pool stays idle (and off the control loop).
                    if not pool.hot and finish >= (int(now / tick_s) + 1) * tick_s:
                        self._heat(pool, now)
                    if now < pool.watch_until:
                        self._report(pool, "ok", now)
                    if cold:
                        self._note_cold_start(pool, (start - now) * 1000.0)
                    if measured:
                        if cold:
                            pool.stats.cold += 1
                        elif start > now:
                            pool.stats.queued += 1
                        served_i.append(i)
                        served_pool.append(pool.index)
                        served_ms.append(spent_ms + rtt_ms + (finish - now) * 1000.0)
                    break
                else:
                    if measured:
                        k = (model_of[m], home)
                        sheds[k] = sheds.get(k, 0) + 1
            if served_i:
                where = np.frombuffer(served_pool, dtype=np.int64)
                np.add.at(histograms, (where, bins_of(np.frombuffer(served_ms))), 1)
                buckets = (chunk.t_s[np.frombuffer(served_i, dtype=np.int64)] / timeline_s).astype(
                    np.int64
                )
                inside = buckets < n_buckets
                np.add.at(served_timeline, (pool_region[where[inside]], buckets[inside]), 1)
        self._run_events_until(trace.duration_s, demand)
        for pool in pool_list:
            pool.stats.histogram = histograms[pool.index].tolist()
            pool.stats.requests = int(histograms[pool.index].sum())
        for pool in pools.values():
            self._account(pool, trace.duration_s)
            pool.stats.timeline.append((trace.duration_s, pool.running, pool.target))
        return SimulationResult(
            models=models,
            regions=regions,
            duration_s=trace.duration_s,
            measured_from_s=measure_from,
            pools={key: pool.stats for key, pool in pools.items()},
            sheds=sheds,
            failed_attempts=failed_attempts,
            requests_timeline=served_timeline,
            timeline_s=timeline_s,
            arrivals=arrivals,
            wall_s=time.perf_counter() - started,
            route_computations=computed,
            route_cache_hits=hits,
            cost_per_replica_s={m: settings.gpu_per_replica.get(m, 1.0) for m in models},
        )

    # --- events -------------------------------------------------------------------------

    def _push(self, at: float, kind: int, payload: object) -> None:
        self._seq += 1
        heappush(self._events, (at, self._seq, kind, payload))

    def _run_events_until(self, until: float, demand: dict[tuple[str, str], int]) -> None:
        events = self._events
        while events and events[0][0] <= until:
            at, _, kind, payload = heapq.heappop(events)
            self._now = at
            if kind == _READY:
                ready_pool, ready_at = cast(tuple[_Pool, float], payload)
                self._ready(ready_pool, ready_at)
            elif kind == _TICK:
                self._tick(cast(int, payload))
            elif kind == _TIMER:
                idle_pool, token = cast(tuple[_Pool, int], payload)
                if not idle_pool.hot and token == idle_pool.timer_token:
                    idle_pool.scaler.skipped_idle(at, self._tick_s, include_now=False)
                    self._tick_pool(idle_pool, at)
            elif kind == _SYNC:
                self._sync_pending = False
                self._sync(at)
            elif kind == _DRILL:
                self._apply_drills()
            elif kind == _OUTAGE:
                region, down = cast(tuple[str, bool], payload)
                for outage_pool in self._pools.values():
                    if outage_pool.region == region:
                        outage_pool.down = down
            elif kind == _POLICY:
                assert self._policy is not None
                floors = self._policy.floors(at, dict(demand))
                demand.clear()
                for key, pool in self._pools.items():
                    floor = floors.get(key, 0)
                    if floor != pool.floor:
                        pool.floor = floor
                        self._heat(pool, at)
                self._push(at + self._policy.interval_s, _POLICY, None)

    def _apply_drills(self) -> None:
        """The drills active now, as the router's network reads them per request; entry colos
        and plans routed under the previous ones are dropped."""
        effects = self._faults.active_effects()
        self._drill = _Drills(
            down=[colo for colo, e in effects.items() if e.down],
            added_latency_ms={
                c: e.added_latency_ms for c, e in effects.items() if e.added_latency_ms
            },
            failing={colo for colo, e in effects.items() if e.error_rate},
        )
        self._entries.clear()
        for cache, deps in zip(self._plan_cache, self._plan_deps, strict=True):
            cache.clear()
            deps.clear()

    def _home_of(self, origin: Origin, model: str) -> str:
        """The region of the origin's nearest colo without drills (where a shed is counted)."""
        nearest = self.world.ranker.rank(model, ClientLocation(origin.lat, origin.lon, "header"))
        return self.world.regions.home(nearest[0].colo_id)

    def _tick(self, k: int) -> None:
        """Serve's control loop, on the pools with something to decide."""
        now = k * self._tick_s
        self._tick_pending = False
        for pool in list(self._hot):
            self._tick_pool(pool, now)
        if self._hot:
            self._schedule_tick(now)

    def _schedule_tick(self, now: float) -> None:
        """The next beat after `now`; beats with no pool to look at are skipped."""
        if not self._tick_pending:
            self._tick_pending = True
            k = math.floor(now / self._tick_s + 1e-9) + 1
            self._push(k * self._tick_s, _TICK, k)

    def _tick_pool(self, pool: _Pool, now: float) -> None:
        finishing = pool.in_system
        while finishing and finishing[0] <= now:
            heappop(finishing)
        scaler = pool.scaler
        scaler.observe(now, len(finishing))
        wanted = scaler.decide(now, pool.running, pool.target, pool.floor)
        if wanted != pool.target:
            self._set_target(pool, wanted, now)
        elif not finishing and not pool.pending and scaler.average_ongoing == 0:
            # Idle: every tick until the next request would see zeros and decide the same, so
            # skip them and wake when the decision it holds fires (Serve's delay).
            self._hot.pop(pool, None)
            pool.hot = False
            pool.timer_token += 1
            fires = scaler.idle_decision_at(now, pool.running, pool.target, pool.floor)
            if fires is not None:
                k = max(
                    math.ceil((fires - 1e-6) / self._tick_s), math.floor(now / self._tick_s) + 1
                )
                self._push(k * self._tick_s, _TIMER, (pool, pool.timer_token))

    def _heat(self, pool: _Pool, now: float) -> None:
        """Back under the control loop: the ticks it skipped saw zero requests."""
        if pool.hot:
            return
        pool.scaler.skipped_idle(now, self._tick_s, include_now=True)
        pool.hot = True
        pool.timer_token += 1
        self._hot[pool] = None
        self._schedule_tick(now)

    def _sync(self, now: float) -> None:
        """A router's snapshot refresh: views from the board, plans dropped where they moved."""
        board = self._board
        still: dict[str, set[str]] = {}
        for model, regions in self._dirty.items():
            before = self._views[model]
            views = dict(before)
            for region in regions:
                views[region] = board.pool(model, region)
            cold_ms = board.cold_start_ms(model)
            # plan_regions reads a view's warm, ejected and saturated only (not the count).
            moved = [
                r for r in regions if _routing_state(views.get(r)) != _routing_state(before.get(r))
            ]
            m = self._model_index[model]
            if cold_ms != self._cold_ms.get(model):
                self._plan_cache[m].clear()  # the detour budget of every plan moved
                self._plan_deps[m].clear()
            else:
                self._drop_plans(m, moved)
            self._views[model] = views
            self._cold_ms[model] = cold_ms
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

    def _drop_plans(self, m: int, regions: Sequence[str]) -> None:
        """Forget the cached plans of model index `m` that read any of these regions' views."""
        cache, deps = self._plan_cache[m], self._plan_deps[m]
        for region in regions:
            for slot in deps.pop(region, ()):
                cache.pop(slot, None)

    def _mark_dirty(self, model: str, region: str) -> None:
        self._dirty.setdefault(model, set()).add(region)
        self._schedule_sync(self._now)

    def _schedule_sync(self, now: float) -> None:
        """Routers refresh their snapshot every sync_s; refreshes that change nothing skipped."""
        if not self._sync_pending:
            self._sync_pending = True
            sync_s = self.settings.sync_s
            self._push((math.floor(now / sync_s + 1e-9) + 1) * sync_s, _SYNC, None)

    def _report(self, pool: _Pool, kind: str, now: float) -> None:
        self._board.report([Outcome(pool.model, pool.region, kind)])  # type: ignore[arg-type]
        if kind == "failed":
            health = self.world.edge.region_policy.health
            pool.watch_until = now + health.window_s + health.max_ejection_s
        self._mark_dirty(pool.model, pool.region)

    def _note_cold_start(self, pool: _Pool, waited_ms: float) -> None:
        if waited_ms > 0:
            self._board.report([Outcome(pool.model, pool.region, "ok", cold_start_ms=waited_ms)])
            self._mark_dirty(pool.model, pool.region)

    # --- replicas -----------------------------------------------------------------------

    def _account(self, pool: _Pool, now: float) -> None:
        start = max(pool.last_t, self._measure_from)
        if now > start:
            pool.stats.replica_s += (pool.running + len(pool.pending)) * (now - start)
        pool.last_t = now

    def _set_target(self, pool: _Pool, target: int, now: float) -> None:
        self._account(pool, now)
        have = pool.running + len(pool.pending)
        if target > have:
            if have == 0 and now >= self._measure_from:
                pool.stats.scale_from_zero += 1
            ready_at = now + pool.cold_start_s
            for _ in range(target - have):
                pool.pending.append(ready_at)
                for _ in range(pool.per_replica):
                    heappush(pool.slots, ready_at)
                self._push(ready_at, _READY, (pool, ready_at))
        elif target < have:
            drop = have - target
            cancelled = min(drop, len(pool.pending))
            del pool.pending[len(pool.pending) - cancelled :]
            pool.running -= drop - cancelled
            # The idlest slots go: a draining replica finishes what it holds.
            keep = sorted(pool.slots)[drop * pool.per_replica :]
            heapq.heapify(keep)
            pool.slots = keep
            if drop - cancelled:
                self._replicas_changed(pool)
        pool.target = target
        self._heat(pool, now)
        pool.stats.timeline.append((now, pool.running, target))

    def _ready(self, pool: _Pool, ready_at: float) -> None:
        if ready_at not in pool.pending:
            return  # cancelled by a downscale before it started
        self._account(pool, ready_at)
        pool.pending.remove(ready_at)
        pool.running += 1
        pool.stats.timeline.append((ready_at, pool.running, pool.target))
        self._replicas_changed(pool)

    def _replicas_changed(self, pool: _Pool) -> None:
        self._board.set_replicas({key: p.running for key, p in self._pools.items()})
        self._mark_dirty(pool.model, pool.region)
