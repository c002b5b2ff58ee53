"""Predictive pre-warming, live: edge-control counts the routers' demand per (model, home region)
bucket by bucket, asks the forecaster the planner evaluates (edge_sim.prewarm) which pools to hold
warm, and holds each with one `hold` call in flight on it (deployments.replica.base).

Why a call in flight: Serve's autoscaler counts it as an ongoing request, so Serve itself keeps
one replica (from zero, its cold-start fast path starts one at once) and, once the hold is
released, scales to zero as usual after `downscale_to_zero_delay_s`. A floor of one replica
through Serve's public API, with every autoscaling field still Serve's; a Serve autoscaling
policy (like deployments.control.keep_warm) could not do this: it runs in Serve's controller, which
cannot import the forecaster, and sees only its own deployment's requests, not a region's
demand (which a warm neighbour serves while the region is cold).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

from edge_sim.clock import Clock, Sleep
from edge_sim.prewarm import Key, PredictivePrewarm, PrewarmConfig

HOLD_RETRY_S = 1.0  # after a hold failed (its replica stopped): the next one starts a replica

log = logging.getLogger("ray.serve")


class PoolHold:
    """One pool held warm: `hold` calls back to back (each `hold_s` long) until released."""

    def __init__(self, handle: Any, hold_s: float, sleep: Sleep):
        self._handle = handle
        self._hold_s = hold_s
        self._sleep = sleep
        self.failures = 0
        self._task = asyncio.get_running_loop().create_task(self._hold_forever())

    async def _hold_forever(self) -> None:
        while True:
            response = None
            try:
                response = self._handle.hold.remote(self._hold_s)
                await response
            except asyncio.CancelledError:
                if response is not None:
                    response.cancel()  # released: the replica stops holding at once
                raise
            except Exception:  # noqa: BLE001 - a replica that stopped under a hold: hold again
                self.failures += 1
                log.debug("pre-warming: a hold failed; holding again", exc_info=True)
                await self._sleep(HOLD_RETRY_S)

    def release(self) -> None:
        self._task.cancel()


class PredictiveWarmer:
    """Edge-control's pre-warming. `note_demand` takes what routers report on each sync; `step`
    runs at every bucket boundary (`run` calls it forever); `held` is what it holds now.

    `pool_handle(model, region)` gives the pool's deployment handle; `clock` is unix time, so
    buckets fall on the same minutes as yesterday's."""

    def __init__(
        self,
        config: PrewarmConfig,
        models: list[str],
        regions: list[str],
        pool_handle: Callable[[str, str], Any],
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
    ):
        self.config = config
        self._keys = set(config.keys(models, regions))
        self._policy = PredictivePrewarm(config, sorted(self._keys))
        self._pool_handle = pool_handle
        self._clock = clock
        self._sleep = sleep
        self._demand: dict[Key, int] = {}
        self._holds: dict[Key, PoolHold] = {}
        self._last_bucket: int | None = None
        self._released_failures = 0

    @property
    def held(self) -> list[Key]:
        return sorted(self._holds)

    def note_demand(self, demand: Mapping[Key, int]) -> None:
        for key, count in demand.items():
            if key in self._keys:
                self._demand[key] = self._demand.get(key, 0) + count

    def step(self) -> None:
        """At a bucket boundary: the bucket that ended goes to the forecaster, whose floors
        start and release holds. A missed boundary (a busy loop) is one empty bucket each."""
        bucket_s = self.config.bucket_s
        bucket = math.floor(self._clock() / bucket_s + 1e-9)
        if self._last_bucket is not None:
            # A period of empty buckets forgets everything: no need to feed more than that.
            first = max(self._last_bucket + 1, bucket - self._policy.forecaster.buckets_per_period)
            for skipped in range(first, bucket):
                self._policy.floors(skipped * bucket_s, {})
        self._last_bucket = bucket
        floors = self._policy.floors(bucket * bucket_s, self._demand)
        self._demand = {}
        for key in [k for k in self._holds if k not in floors]:
            hold = self._holds.pop(key)
            self._released_failures += hold.failures
            hold.release()
        for key in floors:
            if key not in self._holds:
                self._holds[key] = PoolHold(self._pool_handle(*key), bucket_s, self._sleep)

    async def run(self) -> None:
        """Step at every bucket boundary, forever; released holds end with it."""
        try:
            while True:
                bucket_s = self.config.bucket_s
                now = self._clock()
                await self._sleep((math.floor(now / bucket_s + 1e-9) + 1) * bucket_s - now)
                self.step()
        finally:
            for hold in self._holds.values():
                hold.release()
            self._holds.clear()

    def describe(self) -> dict[str, Any]:
        """What the admin view shows: the pools held warm now and holds that failed."""
        return {
            "held": [{"model": m, "region": r} for m, r in self.held],
            "failed_holds": self._released_failures + sum(h.failures for h in self._holds.values()),
        }
