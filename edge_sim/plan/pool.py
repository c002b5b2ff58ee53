"""One deployment's replica pool (a model in a region) as the planner models it on the virtual
clock: replicas running and starting, one slot per replica and ongoing request, the requests
in the system, and its autoscaler."""

from __future__ import annotations

import math

from edge_sim.plan.accounting import PoolStats
from edge_sim.plan.autoscaler import PoolSpec, ServeAutoscaler


class ReplicaPool:
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
