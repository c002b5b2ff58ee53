"""The shared fault store and how router replicas apply it."""

from __future__ import annotations

import asyncio

from deployments.edge_control import EdgeControl, apply_snapshot
from edge_sim.clock import ManualClock
from edge_sim.config import EdgeConfig
from edge_sim.faults import ColoFault
from edge_sim.geo import CountryCentroids
from edge_sim.network import EdgeNetwork

COLOS = [
    {"id": "AAA", "city": "a", "country": "FR", "lat": 0.0, "lon": 0.0},
    {"id": "BBB", "city": "b", "country": "FR", "lat": 0.0, "lon": 10.0},
]


def network(clock: ManualClock, **extra) -> EdgeNetwork:
    config = EdgeConfig.model_validate({"topology": {"colos": COLOS}, **extra})
    return EdgeNetwork(config, clock=clock, centroids=CountryCentroids({}))


def down(net: EdgeNetwork, colo: str) -> bool:
    state = next(s for s in net.colo_states() if s["id"] == colo)
    return any(f["active"] and f["down"] for f in state["faults"])


def test_two_replicas_converge_on_the_store():
    store = EdgeControl()
    clock = ManualClock()
    first, second = network(clock), network(clock)
    asyncio.run(store.set_fault("AAA", {"down": True}))
    version, faults = asyncio.run(store.snapshot())
    assert version == 1
    for replica in (first, second):
        apply_snapshot(replica, faults)
        assert down(replica, "AAA") and not down(replica, "BBB")
    asyncio.run(store.clear_faults("AAA"))
    _, faults = asyncio.run(store.snapshot())
    for replica in (first, second):
        apply_snapshot(replica, faults)
        assert not down(replica, "AAA")


def test_windows_are_shifted_by_the_fault_age():
    clock = ManualClock()
    replica = network(clock)
    faults = {"AAA": [{"fault": {"down": True, "duration_s": 10.0}, "set_at": 100.0}]}
    apply_snapshot(replica, faults, now=104.0)  # set 4 s ago: 6 s of outage remain
    assert down(replica, "AAA")
    clock.advance(5.9)
    assert down(replica, "AAA")
    clock.advance(0.2)
    assert not down(replica, "AAA")
    apply_snapshot(replica, faults, now=111.0)  # the whole window is over: nothing is set
    assert not down(replica, "AAA")


def test_config_declared_faults_on_other_colos_are_left_alone():
    clock = ManualClock()
    replica = network(clock, faults={"BBB": [ColoFault(down=True).model_dump()]})
    apply_snapshot(replica, {"AAA": []})
    assert down(replica, "BBB") and not down(replica, "AAA")


class CountingControl:
    """The edge-control handle as a router replica sees it (`.colo_faults.remote(...)`), on a
    real EdgeControl in this event loop, counting the calls made."""

    def __init__(self, control: EdgeControl):
        self.control = control
        self.colo_faults = self
        self.calls = 0

    def remote(self, known_version: int):
        self.calls += 1
        return self.control.colo_faults(known_version)


def test_a_router_follows_drills_by_long_poll_at_once_and_without_polling_when_idle():
    from deployments.serving.drills import FaultDrills

    async def go() -> None:
        store = EdgeControl()
        handle = CountingControl(store)
        drills = FaultDrills(network(ManualClock()), handle)
        follower = asyncio.get_running_loop().create_task(drills.sync_forever())
        await asyncio.sleep(0.05)
        assert handle.calls == 1  # one poll waiting, not a call every 0.5 s
        await store.set_fault("AAA", {"down": True})
        await asyncio.sleep(0.05)  # the poll returns at once on a change
        assert down(drills.network, "AAA") and not down(drills.network, "BBB")
        assert handle.calls == 2
        await store.clear_faults("AAA")
        await asyncio.sleep(0.05)
        assert not down(drills.network, "AAA")
        follower.cancel()

    asyncio.run(go())
