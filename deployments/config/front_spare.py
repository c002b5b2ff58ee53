"""`args.front_spare` in serve_config.yaml: the second HAProxy on the front port
(deployments.control.front_spare)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class FrontSpareConfig(BaseModel):
    """`args.front_spare` in serve_config.yaml."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = True
    # Each check reads Serve's config file (a few kB) and polls the spare's process: a few
    # microseconds. A router replica added or removed reaches the spare within one interval
    # (its own health checks mark a dead one down meanwhile).
    check_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="how often the spare follows Serve's HAProxy config and restarts itself",
    )
    failed_start_backoff_s: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="after a start that failed (e.g. the port is not shared: Serve's HAProxy "
        "without SO_REUSEPORT), the next try waits this long unless Serve's config changes",
    )
