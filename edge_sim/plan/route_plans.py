"""The planner's routing decisions, cached exactly: a request's entry colos (`ColoRanker.rank`)
and its plan of regions (`plan_regions`) are pure functions of (model, client position, active
drills) and of (reachable regions, pool views, cold-start estimate). One plan is kept per
(model, origin, entry colo) and dropped when an input it read changes (a view that moved, a new
cold-start estimate, a drill starting or ending), so a cached decision is the decision the
router's code would make.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from edge_sim.geo import ClientLocation
from edge_sim.plan.pool import ReplicaPool
from edge_sim.plan.world import Origin, World
from edge_sim.regions import PoolView, plan_regions
from edge_sim.routing import NoColoAvailableError, RouteCandidate


@dataclass(frozen=True, slots=True)
class Drills:
    """The colo drills active now: down, slowed (extra RTT ms), failing a share of requests."""

    down: list[str] = field(default_factory=list)
    added_latency_ms: dict[str, float] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)


class RoutePlan(NamedTuple):
    """Through one entry colo: the attempts in order (pool, RTT ms), the pool to wake and the
    home region (the nearest reachable one)."""

    attempts: tuple[tuple[ReplicaPool, float], ...]
    wake: ReplicaPool | None
    home: str


def routing_state(view: PoolView | None) -> tuple[bool, bool, bool]:
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


class RoutePlans:
    """Entry colos and region plans for a run's requests (by origin index and model index),
    computed on a miss and counted (`computed`, `hits`); `cached` False computes every one."""

    def __init__(
        self,
        world: World,
        models: Sequence[str],
        origins: Sequence[Origin],
        pools: Mapping[tuple[str, str], ReplicaPool],
        *,
        default_cold_start_ms: float,
        failover_attempts: int,
        cached: bool = True,
    ):
        self.world, self.models, self.origins, self.pools = world, models, origins, pools
        self.default_cold_start_ms = default_cold_start_ms
        self.failover_attempts = failover_attempts
        self.cached = cached
        self.drill = Drills()
        self.computed = self.hits = 0
        self._model_index = {m: i for i, m in enumerate(models)}
        self._entries: dict[int, list[RouteCandidate]] = {}
        # Regions from an entry colo, by RTT (RouteCandidate is a frozen value: one per RTT).
        self._reachable: dict[RouteCandidate, list[tuple[str, float]]] = {}
        self._entry_slots = world.edge.routing.max_candidates + 1  # k = len(entries): none took
        self._plans: list[dict[int, RoutePlan]] = [{} for _ in models]
        # Per model: region -> plan slots whose plan read that region's view.
        self._deps: list[dict[str, set[int]]] = [{} for _ in models]
        self._views: dict[str, dict[str, PoolView]] = {m: {} for m in models}
        self._cold_ms: dict[str, float] = {}

    def entries(self, origin: int, m: int) -> list[RouteCandidate]:
        """The ranked entry colos of this origin and model under the drills now."""
        key = origin * len(self.models) + m
        entries = self._entries.get(key)
        if entries is None:
            o = self.origins[origin]
            try:
                entries = self.world.ranker.rank(
                    self.models[m],
                    ClientLocation(o.lat, o.lon, "header"),
                    unavailable=self.drill.down,
                    added_latency_ms=self.drill.added_latency_ms,
                )
            except NoColoAvailableError:
                entries = []
            self._entries[key] = entries
        return entries

    def plan(self, origin: int, m: int, entry_k: int) -> RoutePlan | None:
        """The plan through the `entry_k`-th entry colo; None when there is no such colo
        (every one drilled down)."""
        slot = None
        if self.cached:
            slot = origin * self._entry_slots + entry_k
            found = self._plans[m].get(slot)
            if found is not None:
                self.hits += 1
                return found
        self.computed += 1
        return self._compute(origin, m, entry_k, slot)

    def _compute(self, origin: int, m: int, k: int, slot: int | None) -> RoutePlan | None:
        """With a cache `slot`, the plan is kept there until a view it read moves."""
        entries = self.entries(origin, m)
        if k >= len(entries):
            return None
        model = self.models[m]
        entry = entries[k]
        reachable = self._reachable.get(entry)
        if reachable is None:
            reachable = self._reachable[entry] = [
                (region, entry.rtt_ms + backhaul_ms)
                for region, backhaul_ms in self.world.regions.from_colo(entry.colo_id)
            ]
        views = self._views[model]
        cold_ms = self._cold_ms.get(model, self.default_cold_start_ms)
        max_extra = self.world.edge.routing.max_extra_rtt_ms
        plan = plan_regions(
            reachable,
            views,
            cold_start_ms=cold_ms,
            max_extra_rtt_ms=max_extra,
            max_candidates=self.failover_attempts,
        )
        pools = self.pools
        found = RoutePlan(
            tuple((pools[(model, c.region)], c.rtt_ms) for c in plan.candidates),
            pools[(model, plan.wake)] if plan.wake is not None else None,
            reachable[0][0],
        )
        if slot is not None:
            self._plans[m][slot] = found
            deps = self._deps[m]
            budget_ms = cold_ms if max_extra is None else max_extra
            for region in plan_inputs(reachable, views, self.failover_attempts, budget_ms):
                deps.setdefault(region, set()).add(slot)
        return found

    def set_drills(self, drill: Drills) -> None:
        """New drills: entry colos and plans routed under the previous ones are dropped."""
        self.drill = drill
        self._entries.clear()
        for plans, deps in zip(self._plans, self._deps, strict=True):
            plans.clear()
            deps.clear()

    def refresh(
        self, model: str, updated: Mapping[str, PoolView], cold_ms: float
    ) -> dict[str, PoolView]:
        """A router's snapshot refresh of these regions' views and the cold-start estimate:
        plans dropped where what they read moved. Returns the model's views now."""
        before = self._views[model]
        views = {**before, **updated}
        m = self._model_index[model]
        if cold_ms != self._cold_ms.get(model):
            self._plans[m].clear()  # the detour budget of every plan moved
            self._deps[m].clear()
        else:
            # plan_regions reads a view's warm, ejected and saturated only (not the count).
            plans, deps = self._plans[m], self._deps[m]
            for region in updated:
                if routing_state(views.get(region)) != routing_state(before.get(region)):
                    for slot in deps.pop(region, ()):
                        plans.pop(slot, None)
        self._views[model] = views
        self._cold_ms[model] = cold_ms
        return views

    def home_of(self, origin: int, model: str) -> str:
        """The region of the origin's nearest colo without drills (where a shed is counted)."""
        o = self.origins[origin]
        nearest = self.world.ranker.rank(model, ClientLocation(o.lat, o.lon, "header"))
        return self.world.regions.home(nearest[0].colo_id)
