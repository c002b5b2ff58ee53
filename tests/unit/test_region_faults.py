"""Region drills without Ray: edge-control's store and long poll, and the replica-side gate that
makes a drilled region's replicas fail the requests that reach them. No test sleeps: the gate
runs on a manual clock, and a drill has reached it once it long-polls for what came after."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from deployments.contracts.edge_control_deployment import EdgeControlClient
from deployments.control.edge_control import EdgeControl
from deployments.errors import RegionFaultError
from deployments.replica.faults import ReplicaFaultGate
from edge_sim.clock import ManualClock

POOLS = {"glm": {"eu": "glm-eu", "ap": "glm-ap"}}
DEADLINE_S = 10.0  # a gate that never takes a drill in fails the test instead of hanging it


class ControlHandle:
    """`control.region_faults.remote(...)` on a real EdgeControl, in the same event loop; it
    sees which drill version the gate holds: the one its next long poll asks after."""

    def __init__(self, control: EdgeControl):
        self.control = control
        self.region_faults = self
        self.held = -1
        self._asked = asyncio.Event()

    async def remote(self, region: str, version: int) -> Any:
        self.held = max(self.held, version)
        self._asked.set()
        return await self.control.region_faults(region, version)

    async def holds(self, version: int) -> None:
        """Return once the gate has taken in drill `version` (or a later one)."""

        async def asked_after() -> None:
            while self.held < version:
                self._asked.clear()
                await self._asked.wait()

        await asyncio.wait_for(asked_after(), DEADLINE_S)


async def loop_turns(turns: int = 50) -> None:
    """Let every ready task run on, with no time passing."""
    for _ in range(turns):
        await asyncio.sleep(0)


def test_a_drilled_region_fails_requests_in_its_replicas_and_others_do_not() -> None:
    async def go() -> None:
        control = EdgeControl(POOLS)
        handle = ControlHandle(control)
        client = EdgeControlClient(handle)
        ap, eu = ReplicaFaultGate("ap", client), ReplicaFaultGate("eu", client)
        await ap.check()  # no drill: passes
        await handle.holds(await control.set_region_fault("ap", {"down": True}))
        with pytest.raises(RegionFaultError) as caught:
            await ap.check()
        assert caught.value.status == 503 and "ap" in caught.value.message
        await eu.check()
        await handle.holds(await control.clear_region_faults("ap"))
        await ap.check()

    asyncio.run(go())


def test_a_drill_window_and_an_error_rate_apply_in_the_replica() -> None:
    async def go() -> None:
        control = EdgeControl(POOLS)
        handle = ControlHandle(control)
        version = await control.set_region_fault(
            "ap", {"down": True, "start_after_s": 60, "duration_s": 30}
        )
        clock = ManualClock(time.time())  # edge-control stamped the drill just now, in unix time
        gate = ReplicaFaultGate("ap", EdgeControlClient(handle), rng=random.Random(1), clock=clock)
        await gate.check()  # scheduled, not active yet
        await handle.holds(version)
        clock.advance(60.0)
        with pytest.raises(RegionFaultError):
            await gate.check()
        clock.advance(30.0)
        await gate.check()  # the window is over
        await handle.holds(await control.set_region_fault("ap", {"error_rate": 0.5}))
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
    async def go() -> None:
        control = EdgeControl(POOLS)
        await control.set_region_fault("eu", {"added_latency_ms": 200})
        clock = ManualClock(time.time())
        client = EdgeControlClient(ControlHandle(control))
        gate = ReplicaFaultGate("eu", client, clock=clock, sleep=clock.sleep)
        started = clock()
        await gate.check()
        assert clock() - started == pytest.approx(0.2)

    asyncio.run(go())


def test_without_a_region_or_control_the_gate_does_nothing() -> None:
    asyncio.run(ReplicaFaultGate(None, EdgeControlClient(object())).check())
    asyncio.run(ReplicaFaultGate("eu", None).check())


def test_the_long_poll_waits_for_a_change_then_answers_at_once() -> None:
    async def go() -> None:
        control = EdgeControl(POOLS)
        version, _ = await control.region_faults("ap", -1)  # unknown version: at once
        waiting = asyncio.ensure_future(control.region_faults("ap", version))
        await loop_turns()
        assert not waiting.done()  # nothing changed: it waits (for its 30 s time-out)
        new_version = await control.set_region_fault("ap", {"down": True})
        await loop_turns()  # no time passes: only the change can have answered it
        assert waiting.done()
        answered_version, entries = waiting.result()
        assert entries[0]["fault"]["down"] is True
        assert answered_version == new_version == version + 1

    asyncio.run(go())
