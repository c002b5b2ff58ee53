"""What a planner run is given besides the world and the trace: measured times and the planner's
own knobs (`SimSettings`), region outages to drill, and the custom autoscaling floor it asks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

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
