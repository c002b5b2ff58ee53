"""Serve's controller over the planner's replica pools: each busy pool's autoscaler sampled on one
beat, idle pools off the beat until their held decision fires, replicas started (ready after the
cold start) and stopped, and the replica-seconds they cost."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from heapq import heappop, heappush

from edge_sim.plan.events import READY, TICK, TIMER, EventQueue
from edge_sim.plan.pool import ReplicaPool


class ServeController:
    """The control loop of one run; `replicas_changed(pool)` is told when a pool's running
    replicas change (the router's board must see it)."""

    def __init__(
        self,
        events: EventQueue,
        tick_s: float,
        measure_from: float,
        replicas_changed: Callable[[ReplicaPool], None],
    ):
        self._events = events
        self.tick_s = tick_s
        self._measure_from = measure_from
        self._replicas_changed = replicas_changed
        self._hot: dict[ReplicaPool, None] = {}
        self.tick_pending = False

    def tick(self, k: int) -> None:
        """Serve's control loop, on the pools with something to decide."""
        now = k * self.tick_s
        self.tick_pending = False
        for pool in list(self._hot):
            self.tick_pool(pool, now)
        if self._hot:
            self._schedule_tick(now)

    def _schedule_tick(self, now: float) -> None:
        """The next beat after `now`; beats with no pool to look at are skipped."""
        if not self.tick_pending:
            self.tick_pending = True
            k = math.floor(now / self.tick_s + 1e-9) + 1
            self._events.push(k * self.tick_s, TICK, k)

    def tick_pool(self, pool: ReplicaPool, now: float) -> None:
        finishing = pool.in_system
        while finishing and finishing[0] <= now:
            heappop(finishing)
        scaler = pool.scaler
        scaler.observe(now, len(finishing))
        wanted = scaler.decide(now, pool.running, pool.target, pool.floor)
        if wanted != pool.target:
            self.set_target(pool, wanted, now)
        elif not finishing and not pool.pending and scaler.average_ongoing == 0:
            # Idle: every tick until the next request would see zeros and decide the same, so
            # skip them and wake when the decision it holds fires (Serve's delay).
            self._hot.pop(pool, None)
            pool.hot = False
            pool.timer_token += 1
            fires = scaler.idle_decision_at(now, pool.running, pool.target, pool.floor)
            if fires is not None:
                k = max(math.ceil((fires - 1e-6) / self.tick_s), math.floor(now / self.tick_s) + 1)
                self._events.push(k * self.tick_s, TIMER, (pool, pool.timer_token))

    def heat(self, pool: ReplicaPool, now: float) -> None:
        """Back under the control loop: the ticks it skipped saw zero requests."""
        if pool.hot:
            return
        pool.scaler.skipped_idle(now, self.tick_s, include_now=True)
        pool.hot = True
        pool.timer_token += 1
        self._hot[pool] = None
        self._schedule_tick(now)

    def account(self, pool: ReplicaPool, now: float) -> None:
        since = max(pool.last_t, self._measure_from)
        pool.stats.add_replica_time(pool.running + len(pool.pending), since, now)
        pool.last_t = now

    def set_target(self, pool: ReplicaPool, target: int, now: float) -> None:
        self.account(pool, now)
        have = pool.running + len(pool.pending)
        if target > have:
            if have == 0 and now >= self._measure_from:
                pool.stats.scale_from_zero += 1
            ready_at = now + pool.cold_start_s
            for _ in range(target - have):
                pool.pending.append(ready_at)
                for _ in range(pool.per_replica):
                    heappush(pool.slots, ready_at)
                self._events.push(ready_at, READY, (pool, ready_at))
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
        self.heat(pool, now)
        pool.stats.timeline.append((now, pool.running, target))

    def ready(self, pool: ReplicaPool, ready_at: float) -> None:
        if ready_at not in pool.pending:
            return  # cancelled by a downscale before it started
        self.account(pool, ready_at)
        pool.pending.remove(ready_at)
        pool.running += 1
        pool.stats.timeline.append((ready_at, pool.running, pool.target))
        self._replicas_changed(pool)
