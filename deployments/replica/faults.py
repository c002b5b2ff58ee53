"""Region fault drills, applied inside the model replica: a region marked down makes its replicas
fail the requests that reach them, so the router sees the same real error a broken replica gives
(and fails over, and counts it against the region's health)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

from deployments.contracts.edge_control_deployment import EdgeControlClient
from deployments.contracts.faults import fault_window
from deployments.errors import RegionFaultError
from edge_sim.clock import Clock, Sleep
from edge_sim.faults import ColoFault

log = logging.getLogger("ray.serve")
FIRST_FETCH_TIMEOUT_S = 2.0
RETRY_S = 1.0


class ReplicaFaultGate:
    """Keeps this replica's region drills current (a long poll on edge-control) and applies them
    to each call. Without a region or an edge-control client it does nothing.

    clock: unix seconds, the scale of the `set_at` edge-control stamps on each drill (monotonic
    clocks of two processes share no origin). sleep: waits out added latency and poll retries."""

    def __init__(
        self,
        region: str | None,
        control: EdgeControlClient | None = None,
        rng: random.Random | None = None,
        clock: Clock = time.time,
        sleep: Sleep = asyncio.sleep,
    ):
        self.region = region
        self._control = control if region is not None else None
        self._rng = rng or random.Random()
        self._clock = clock
        self._sleep = sleep
        self._entries: list[dict[str, Any]] = []
        self._version = -1
        self._fetched = asyncio.Event()
        self._watcher: asyncio.Task[None] | None = None

    async def check(self) -> None:
        """Raise RegionFaultError (or wait out added latency) if a drill is active now."""
        if self._control is None:
            return
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        if not self._fetched.is_set():
            try:
                await asyncio.wait_for(self._fetched.wait(), FIRST_FETCH_TIMEOUT_S)
            except TimeoutError:
                log.warning("region %s: no drill state from edge-control yet", self.region)
        now = self._clock()
        active = [
            ColoFault.model_validate(entry["fault"])
            for entry in self._entries
            if fault_window(entry, now)[0] <= now < fault_window(entry, now)[1]
        ]
        if not active:
            return
        delay_ms = sum(fault.added_latency_ms for fault in active)
        if delay_ms:
            await self._sleep(delay_ms / 1000.0)
        if any(fault.down for fault in active):
            raise RegionFaultError(f"region {self.region} is down (fault drill)", retry_after_s=1)
        for fault in active:
            if fault.error_rate and self._rng.random() < fault.error_rate:
                raise RegionFaultError(
                    f"region {self.region} failed the request (fault drill)", retry_after_s=1
                )

    async def _watch(self) -> None:
        assert self._control is not None and self.region is not None
        while True:
            try:
                version, entries = await self._control.region_faults(self.region, self._version)
                self._version, self._entries = version, list(entries)
                self._fetched.set()
            except Exception:  # noqa: BLE001 - edge-control restarting: keep the last state
                log.warning("region %s: drill poll failed", self.region, exc_info=True)
                await self._sleep(RETRY_S)
