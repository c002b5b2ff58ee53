"""Pre-warming: a Ray Serve autoscaling policy that holds a model at a floor of replicas during
scheduled windows (office hours, a nightly batch) and scales to zero outside them.

Used from a deployment's `autoscaling_config` in serve_config.yaml:

    policy:
      policy_function: deployments.control.keep_warm:KeepWarm
      policy_kwargs:
        windows:
          - {days: [mon, tue, wed, thu, fri], start: "08:55", end: "18:00",
             timezone: Europe/Berlin, replicas: 1}

Within a window the deployment has at least `replicas` replicas; traffic can take it higher as
usual (Ray Serve's own request-based policy decides, and its delays and bounds still apply).
Start a window a cold start (a few seconds, `x-edge-cold-start-ms`) before the traffic it is for.

Ray Serve pickles this module by value into its controller, which cannot import the project:
keep it to the standard library, pydantic and Ray. And never raise there: Ray 2.60's controller
does not catch a policy's exceptions, and one breaks `serve status` for every deployment. A bad
schedule is reported by `python -m deployments.serve_file` before deploying; deployed anyway, it is
logged in the controller's log and the model scales by requests alone.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from datetime import time as time_of_day
from typing import TYPE_CHECKING, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext

KEEP_WARM_POLICY = "deployments.control.keep_warm:KeepWarm"  # the `policy_function` that names it
Weekday = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
WEEKDAYS: tuple[Weekday, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
logger = logging.getLogger("ray.serve")  # Serve's logger: lands in the controller's log


class WarmWindow(BaseModel):
    """A daily window on the given weekdays. `end` at or before `start` runs past midnight into
    the next day (start == end: 24 hours); the window belongs to the day it starts on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    days: list[Weekday] = Field(default_factory=lambda: list(WEEKDAYS), min_length=1)
    start: time_of_day = time_of_day(0, 0)
    end: time_of_day = time_of_day(0, 0)
    timezone: str = "UTC"
    replicas: int = Field(default=1, ge=1, le=1000)

    @field_validator("start", "end", mode="before")
    @classmethod
    def _quoted_time(cls, value: Any) -> Any:
        if isinstance(value, int | float):  # YAML 1.1 reads an unquoted 18:00 as 1080
            raise ValueError('write times of day quoted, e.g. "18:00"')
        return value

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, name: str) -> str:
        try:
            ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(
                f"unknown time zone {name!r} (an IANA name, e.g. Europe/Berlin)"
            ) from None
        return name

    def covers(self, instant: datetime) -> bool:
        """Is this aware datetime inside the window?"""
        local = instant.astimezone(ZoneInfo(self.timezone))
        length = _minutes(self.end) - _minutes(self.start)
        if length <= 0:
            length += 24 * 60
        # The window may have opened today or, running past midnight, yesterday.
        for opened_days_ago in (0, 1):
            day = local - timedelta(days=opened_days_ago)
            if WEEKDAYS[day.weekday()] not in self.days:
                continue
            opens = datetime.combine(day.date(), self.start, tzinfo=local.tzinfo)
            if opens <= local < opens + timedelta(minutes=length):
                return True
        return False


class KeepWarmConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    windows: list[WarmWindow] = Field(min_length=1)

    def floor_at(self, instant: datetime) -> int:
        """The fewest replicas the schedule asks for at this instant (0 outside every window)."""
        return max((w.replicas for w in self.windows if w.covers(instant)), default=0)


class KeepWarm:
    """Ray Serve instantiates this once per deployment with `policy_kwargs`, then calls it on
    every autoscaling tick; it returns (desired replicas, policy state)."""

    def __init__(self, **policy_kwargs: Any):
        # Imported here so that checking a config (deployments.config) does not load Ray Serve.
        from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy

        self._by_requests = replica_queue_length_autoscaling_policy
        self.config: KeepWarmConfig | None = None
        try:
            self.config = KeepWarmConfig.model_validate(policy_kwargs)
        except ValidationError as exc:
            logger.error(
                "keep-warm schedule ignored, scaling by requests alone: %s",
                "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()),
            )

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
        desired, state = self._by_requests(ctx)
        return max(desired, self.floor(ctx.current_time)), state

    def floor(self, now_unix_s: float | None) -> int:
        if self.config is None:
            return 0
        try:
            instant = datetime.fromtimestamp(now_unix_s or time.time(), UTC)
            return self.config.floor_at(instant)
        except Exception:  # noqa: BLE001 - see the module docstring: never raise in the controller
            logger.exception("keep-warm schedule failed; scaling by requests alone this tick")
            return 0


def _minutes(at: time_of_day) -> int:
    return at.hour * 60 + at.minute
