"""Region drills without Ray: edge-control's store and long poll, and the replica-side gate that
makes a drilled region's replicas fail the requests that reach them."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from deployments.edge_control import EdgeControl
from deployments.errors import RegionFaultError
from deployments.servers.faults import ReplicaFaultGate

POOLS = {"glm": {"eu": "glm-eu", "ap": "glm-ap"}}


class ControlHandle:
    """`control.region_faults.remote(...)` on a real EdgeControl, in the same event loop."""

    def __init__(self, control: EdgeControl):
        self.control = control
        self.region_faults = self

    def remote(self, region: str, version: int) -> Any:
        return self.control.region_faults(region, version)


def test_a_drilled_region_fails_requests_in_its_replicas_and_others_do_not() -> None:
    async def go() -> None:
        control = EdgeControl(POOLS)
        handle = ControlHandle(control)
        ap, eu = ReplicaFaultGate("ap", handle), ReplicaFaultGate("eu", handle)
        await ap.check()  # no drill: passes
        await control.set_region_fault("ap", {"down": True})
        await asyncio.sleep(0.05)  # the long poll returns at once on a change
        with pytest.raises(RegionFaultError) as caught:
            await ap.check()
        assert caught.value.status == 503 and "ap" in caught.value.message
        await eu.check()
        await control.clear_region_faults("ap")
        await asyncio.sleep(0.05)
        await ap.check()

    asyncio.run(go())


def test_a_drill_window_and_an_error_rate_apply_in_the_replica() -> None:
    async def go() -> None:
        control = EdgeControl(POOLS)
        gate = ReplicaFaultGate("ap", ControlHandle(control), rng=random.Random(1))
        await control.set_region_fault("ap", {"down": True, "start_after_s": 60})
        await gate.check()  # scheduled, not active yet
        await control.set_region_fault("ap", {"error_rate": 0.5})
        await asyncio.sleep(0.05)
        outcomes = []
        for _ in range(200):
            try:
                await gate.check()
                outcomes.append(True)
            except RegionFaultError:
                outcomes.append(False)
        assert 60 < outcomes.count(False) < 140

    asyncio.run(go())


def test_added_latency_is_waited_out_in_the_replica() -> None:
    async def go() -> float:
        control = EdgeControl(POOLS)
        gate = ReplicaFaultGate("eu", ControlHandle(control))
        await control.set_region_fault("eu", {"added_latency_ms": 200})
        started = time.monotonic()
        await gate.check()
        return time.monotonic() - started

    assert asyncio.run(go()) >= 0.2


def test_without_a_region_or_control_the_gate_does_nothing() -> None:
    asyncio.run(ReplicaFaultGate(None, object()).check())
    asyncio.run(ReplicaFaultGate("eu", None).check())


def test_the_long_poll_waits_for_a_change_then_answers() -> None:
    async def go() -> tuple[float, int]:
        control = EdgeControl(POOLS)
        version, _ = await control.region_faults("ap", -1)  # unknown version: at once
        waiting = asyncio.ensure_future(control.region_faults("ap", version))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        started = time.monotonic()
        await control.set_region_fault("ap", {"down": True})
        new_version, entries = await waiting
        assert entries[0]["fault"]["down"] is True
        return time.monotonic() - started, new_version - version

    elapsed, step = asyncio.run(go())
    assert elapsed < 0.5 and step == 1
