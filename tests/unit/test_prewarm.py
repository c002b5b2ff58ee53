"""Predictive pre-warming live, without Ray: edge-control's warmer on a manual clock with fake pool
handles (holds started ahead of yesterday's morning, released at night, renewed when a replica
drops one), the routers' demand reaching it through sync, and its config's checks."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from deployments.config import ConfigError, parse_app_config
from deployments.control.edge_control import EdgeControl
from deployments.control.prewarm import HOLD_RETRY_S, PredictiveWarmer
from edge_sim.clock import ManualClock
from edge_sim.prewarm import PrewarmConfig

KEY = ("glm", "eu")
DAY_S = 86_400.0
CONFIG = PrewarmConfig(enabled=True, bucket_s=60, lookahead_s=600, min_expected=1)


class FakeHold:
    """A DeploymentResponse of `hold`: pending until the test ends it, or cancelled."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.cancelled = False
        self.future: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    def __await__(self) -> Any:
        return self.future.__await__()

    def cancel(self) -> None:
        self.cancelled = True


class FakePool:
    """A pool's deployment handle: `.hold.remote(seconds)` records the hold it starts."""

    def __init__(self) -> None:
        self.holds: list[FakeHold] = []
        self.hold = self

    def remote(self, seconds: float) -> FakeHold:
        self.holds.append(FakeHold(seconds))
        return self.holds[-1]

    @property
    def in_flight(self) -> list[FakeHold]:
        return [h for h in self.holds if not h.cancelled and not h.future.done()]


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_a_pool_is_held_ahead_of_yesterdays_morning_and_released_at_night():
    clock = ManualClock()
    pools = {KEY: FakePool()}
    warmer = PredictiveWarmer(CONFIG, ["glm"], ["eu"], lambda m, r: pools[(m, r)], clock)
    busy = range(9 * 60, 18 * 60)  # minutes of the day with traffic: 09:00-18:00
    held_at: dict[int, bool] = {}

    async def two_days() -> None:
        for minute in range(2 * 1440):
            clock.advance(60.0)  # the end of minute `minute`
            if minute % 1440 in busy:
                warmer.note_demand({KEY: 5, ("kimi", "eu"): 3})  # kimi: not a pre-warmed key
            warmer.step()
            await turns(2)
            held_at[minute + 1] = bool(pools[KEY].in_flight)

    asyncio.run(two_days())
    day2 = 1440
    assert not held_at[9 * 60 - 8]  # day one has no yesterday: the morning meets a cold start
    assert held_at[day2 + 9 * 60 - 8]  # day two: held 8 minutes before yesterday's 09:00
    assert not held_at[day2 + 9 * 60 - 15]
    assert held_at[day2 + 12 * 60]
    assert not held_at[day2 + 22 * 60]  # released at night...
    released = [h for h in pools[KEY].holds if h.cancelled]
    assert released and not pools[KEY].in_flight  # ...by cancelling the hold in flight
    assert {h.seconds for h in pools[KEY].holds} == {CONFIG.bucket_s}
    assert warmer.held == []


def test_a_hold_that_ends_or_fails_is_renewed_while_the_forecast_stands():
    clock = ManualClock(1000 * 60.0)
    pool = FakePool()
    warmer = PredictiveWarmer(CONFIG, ["glm"], ["eu"], lambda m, r: pool, clock, clock.sleep)

    async def go() -> None:
        warmer.note_demand({KEY: 10})  # traffic now: the EWMA holds the pool
        warmer.step()
        await turns()
        assert len(pool.in_flight) == 1
        pool.in_flight[0].future.set_result(0.0)  # the hold ran its bucket_s: the next follows
        await turns()
        assert len(pool.in_flight) == 1 and len(pool.holds) == 2
        started = clock()
        pool.in_flight[0].future.set_exception(RuntimeError("replica stopped"))
        await turns()
        assert clock() - started == HOLD_RETRY_S and len(pool.in_flight) == 1
        assert warmer.describe() == {"held": [{"model": "glm", "region": "eu"}], "failed_holds": 1}

    asyncio.run(go())


def test_a_late_step_lets_the_missed_buckets_count_as_quiet_ones():
    clock = ManualClock(0.0)
    pool = FakePool()
    warmer = PredictiveWarmer(CONFIG, ["glm"], ["eu"], lambda m, r: pool, clock)

    async def go() -> list[tuple[str, str]]:
        warmer.step()
        clock.advance(60.0)
        warmer.note_demand({KEY: 60})
        warmer.step()
        await turns()
        assert warmer.held == [KEY]
        clock.advance(20 * 60.0)  # twenty minutes without a step (a stalled event loop)
        warmer.step()
        await turns()
        return warmer.held

    # Twenty quiet minutes decay the recent rate 0.7^20-fold: nothing to hold any more (one
    # step for all of them would have decayed it once and held on).
    assert asyncio.run(go()) == []
    assert not pool.in_flight


def test_edge_control_takes_the_routers_demand_on_sync_and_shows_what_it_holds():
    clock = ManualClock(5 * 60.0)
    handles: dict[str, FakePool] = {"glm-eu": FakePool(), "glm-ap": FakePool()}
    control = EdgeControl(
        {"glm": {"eu": "glm-eu", "ap": "glm-ap"}},
        clock=clock,
        wall_clock=clock,
        read_serve=lambda: {},
        prewarm=CONFIG.model_dump(mode="json"),
        pool_handle=handles.__getitem__,
    )

    async def go() -> list[dict[str, Any]]:
        await control.sync([], {("glm", "ap"): 4})
        assert control.warmer is not None
        clock.advance(60.0)
        control.warmer.step()
        await turns()
        return await control.regions()

    described = asyncio.run(go())
    held = {r["region"]: r["models"]["glm"]["prewarm_held"] for r in described}
    assert held == {"ap": True, "eu": False}
    assert len(handles["glm-ap"].holds) == 1 and not handles["glm-eu"].holds


def test_edge_control_without_prewarm_shows_no_hold_and_ignores_demand():
    control = EdgeControl({"glm": {"eu": "glm-eu"}}, read_serve=lambda: {})

    async def go() -> list[dict[str, Any]]:
        await control.sync([], {("glm", "eu"): 4})
        return await control.regions()

    assert control.warmer is None
    assert "prewarm_held" not in asyncio.run(go())[0]["models"]["glm"]


def _args(prewarm: dict[str, Any]) -> dict[str, Any]:
    return {
        "models": {"glm": {"task": "chat", "family": "glm", "model_dir": "glm"}},
        "edge": {"prewarm": prewarm},
    }


@pytest.mark.parametrize(
    ("prewarm", "message"),
    [
        ({"models": ["kimi"]}, "edge.prewarm.models: ['kimi'] are not served models"),
        ({"lookahead_s": 30, "bucket_s": 60}, "lookahead_s (30) must be at least bucket_s (60)"),
        ({"lookahead_s": 3600, "period_s": 600}, "must be shorter than period_s (600)"),
        ({"bucket_s": 0}, "bucket_s"),
        ({"enable": True}, "enable"),
    ],
)
def test_a_bad_prewarm_section_is_refused_naming_the_field(prewarm, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_app_config(_args(prewarm))


def test_prewarm_is_off_unless_enabled():
    assert parse_app_config(_args({})).edge.prewarm.enabled is False
