"""`args.warm_pool` in serve_config.yaml: read by the app's config in every process, used by the
warm pool (deployments.control.warm_pool)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class WarmPoolConfig(BaseModel):
    """`args.warm_pool` in serve_config.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    workers_per_node: int = Field(
        default=2, ge=0, le=32, description="idle preloaded workers kept on each node with CPUs"
    )
    keep_alive_s: int = Field(
        default=600,
        ge=10,
        description="how long an unused warm worker is kept from Ray's idle-worker reaper; "
        "the pool replaces it when it is gone",
    )
    check_interval_s: float = Field(
        default=2.0, gt=0, le=60, description="one GetNodeStats per node and round"
    )
    # Each round asks every raylet for its workers' stats, which each worker answers: every 2 s
    # that cost about 0.006 of a core at rest (the pool's replica, the raylet, its workers).
    idle_check_interval_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="the longest wait between rounds while every node's pool stays full "
        "(a replica started by Serve's autoscaler takes a worker the pool sees by then)",
    )
    # A preloaded worker appears 2-4 s after it is asked for on a quiet 2-core machine, but the
    # raylet drops some asks unanswered (seen after cold starts: the pool sat one worker short
    # until it asked again), and a cold start that finds no idle worker takes 3.5-4 s instead
    # of 0.5 s. Asked again sooner, a slow worker may arrive besides its replacement: one spare
    # idle worker, which replicas take like any other.
    start_grace_s: float = Field(
        default=10.0, gt=0, description="a worker asked for and not seen by then counts as lost"
    )
    refill_delay_s: float = Field(
        default=3.0,
        ge=0,
        le=600,
        description="a worker taken by a replica is replaced this long after, off the new "
        "replica's first requests",
    )

    @model_validator(mode="after")
    def _idle_rounds_are_not_faster(self) -> WarmPoolConfig:
        if self.idle_check_interval_s < self.check_interval_s:
            raise ValueError(
                f"idle_check_interval_s ({self.idle_check_interval_s}) must be at least "
                f"check_interval_s ({self.check_interval_s})"
            )
        return self
