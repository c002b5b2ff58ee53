"""Edge-control without Ray: the shared fault store and how router replicas apply it, its view of
Serve (kept through failed reads) and the pace of its reads, on manual clocks and fake reads."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from deployments.contracts.edge_control_deployment import EdgeControlClient
from deployments.contracts.faults import apply_snapshot
from deployments.control.edge_control import EdgeControl, ServeView
from deployments.pacing import PollPacer
from deployments.ray_ext.serve_details import DeploymentReplicas
from edge_sim.clock import ManualClock
from edge_sim.config import EdgeConfig
from edge_sim.faults import ColoFault
from edge_sim.geo import CountryCentroids
from edge_sim.network import EdgeNetwork
from edge_sim.region_board import Outcome, RegionBoard
from edge_sim.regions import RegionPolicy

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
    """The edge-control handle as a router replica's EdgeControlClient calls it
    (`.colo_faults.remote(...)`), on a real EdgeControl in this event loop: counts the calls made
    and those still waiting."""

    def __init__(self, control: EdgeControl):
        self.control = control
        self.colo_faults = self
        self.calls = 0
        self.waiting = 0
        self._called = asyncio.Condition()

    def remote(self, known_version: int) -> Any:
        return self._call(known_version)

    async def _call(self, known_version: int) -> Any:
        async with self._called:
            self.calls += 1
            self._called.notify_all()
        self.waiting += 1
        try:
            return await self.control.colo_faults(known_version)
        finally:
            self.waiting -= 1

    async def called(self, times: int) -> None:
        """Until the router made its `times`-th call: it makes one only once it applied the
        answer to the one before."""
        async with self._called:
            await self._called.wait_for(lambda: self.calls >= times)


def test_a_router_follows_drills_by_long_poll_at_once_and_without_polling_when_idle():
    from deployments.ingress.serving.drills import FaultDrills

    async def go() -> None:
        store = EdgeControl()
        handle = CountingControl(store)
        drills = FaultDrills(network(ManualClock()), EdgeControlClient(handle))
        follower = asyncio.get_running_loop().create_task(drills.sync_forever())
        await handle.called(1)
        assert handle.waiting == 1  # one long poll held open, not a poll loop
        await store.set_fault("AAA", {"down": True})
        await handle.called(2)  # the poll returned at once on the change, and was applied
        assert down(drills.network, "AAA") and not down(drills.network, "BBB")
        assert (handle.calls, handle.waiting) == (2, 1)
        await store.clear_faults("AAA")
        await handle.called(3)
        assert not down(drills.network, "AAA")
        follower.cancel()

    asyncio.run(go())


def test_fault_windows_in_the_admin_view_follow_edge_controls_wall_clock():
    wall = ManualClock(1_000_000.0)
    control = EdgeControl(POOLS, wall_clock=wall, **FakeServe().readers())

    async def ap_faults() -> list[dict[str, Any]]:
        (ap,) = [r for r in await control.regions() if r["region"] == "ap"]
        faults: list[dict[str, Any]] = ap["faults"]
        return faults

    async def go() -> None:
        await control.set_region_fault("ap", {"down": True, "start_after_s": 10, "duration_s": 5})
        (scheduled,) = await ap_faults()
        assert not scheduled["active"] and scheduled["starts_in_s"] == 10
        wall.advance(12)
        (running,) = await ap_faults()
        assert running["active"] and running["ends_in_s"] == 3
        wall.advance(3)
        assert await ap_faults() == []  # over: no longer listed

    asyncio.run(go())


def test_a_router_replica_that_stops_publishing_drops_out_after_a_while():
    clock = ManualClock()
    control = EdgeControl(clock=clock)
    asyncio.run(control.report_traffic("r1", {"requests": 1}))
    clock.advance(9.9)
    asyncio.run(control.report_traffic("r2", {"requests": 2}))
    assert set(asyncio.run(control.traffic())) == {"r1", "r2"}
    clock.advance(0.2)  # r1 published 10.1 s ago
    assert asyncio.run(control.traffic()) == {"r2": {"requests": 2}}


# ---- the view of Serve ---------------------------------------------------------------------

POOLS = {"glm": {"eu": "glm-eu", "ap": "glm-ap"}}
PICKLE_RACE = ValueError(
    "<module 'ray.serve.autoscaling_policy'> is not registered for pickle by value"
)


class FakeServe:
    """Serve's deployments as edge-control reads them, from state a test sets; an error set here
    is raised by the next reads (as the live controller's did)."""

    def __init__(self) -> None:
        self.running = {"glm-eu": 1, "glm-ap": 0}
        self.targets: dict[str, int | None] = {"glm-eu": 1, "glm-ap": 0}
        self.settling: set[str] = set()
        self.error: Exception | None = None
        self.reads = 0

    def read(self) -> Mapping[str, DeploymentReplicas]:
        self.reads += 1
        if self.error is not None:
            raise self.error
        return {
            name: DeploymentReplicas(running, self.targets[name], name in self.settling)
            for name, running in self.running.items()
        }

    def readers(self) -> dict[str, Any]:
        return {"read_serve": self.read}


def pools(described: list[dict[str, Any]]) -> dict[str, tuple[int, int, bool]]:
    """region -> glm's (running, wanted, warm) in the admin view."""
    return {
        r["region"]: (
            r["models"]["glm"]["replicas_running"],
            r["models"]["glm"]["replicas_wanted"],
            r["models"]["glm"]["warm"],
        )
        for r in described
    }


def test_a_failing_read_of_serve_keeps_the_last_good_view_for_routers_and_admins():
    serve = FakeServe()
    clock = ManualClock()
    control = EdgeControl(POOLS, clock=clock, **serve.readers())

    async def go() -> None:
        warm = await control.sync([])
        assert warm.pool("glm", "eu").warm and not warm.pool("glm", "ap").warm
        assert pools(await control.regions()) == {"eu": (1, 1, True), "ap": (0, 0, False)}

        # Serve answers with the error seen live, while the ap pool scales up meanwhile.
        serve.error = PICKLE_RACE
        serve.running, serve.targets = {"glm-eu": 1, "glm-ap": 1}, {"glm-eu": 1, "glm-ap": 1}
        clock.advance(7.0)
        described = await control.regions()  # no error reaches the admin
        assert pools(described) == {"eu": (1, 1, True), "ap": (0, 0, False)}
        view = described[0]["serve_view"]
        assert view["age_s"] == 7.0 and view["failed_reads"] >= 1
        assert "not registered for pickle by value" in view["error"]
        still = await control.sync([Outcome("glm", "eu", "ok")])
        assert still.pool("glm", "eu").warm and not still.pool("glm", "ap").warm

        serve.error = None  # Serve answers again
        described = await control.regions()
        assert pools(described) == {"eu": (1, 1, True), "ap": (1, 1, True)}
        assert described[0]["serve_view"]["error"] is None
        assert (await control.sync([])).pool("glm", "ap").warm

    asyncio.run(go())


def test_with_serve_failing_from_the_start_every_pool_reads_cold_and_nothing_raises():
    serve = FakeServe()
    serve.error = RuntimeError("no Serve client in this process")
    control = EdgeControl(POOLS, **serve.readers())
    described = asyncio.run(control.regions())
    assert pools(described) == {"eu": (0, 0, False), "ap": (0, 0, False)}
    assert described[0]["serve_view"]["age_s"] is None


def view(serve: FakeServe, pacer: PollPacer | None = None) -> ServeView:
    board = RegionBoard(["glm"], ["ap", "eu"], RegionPolicy(), 3000.0, ManualClock())
    return ServeView(POOLS, board, serve.read, ManualClock(), pacer)


def test_a_read_is_busy_when_replicas_changed_or_are_settling():
    serve = FakeServe()
    watched = view(serve)

    async def go() -> list[bool]:
        busy = [await watched.refresh()]  # the first read: nothing to compare with
        busy.append(await watched.refresh())  # the same replicas
        serve.running = {"glm-eu": 1, "glm-ap": 1}
        busy.append(await watched.refresh())  # one more
        serve.settling = {"glm-ap"}
        busy.append(await watched.refresh())  # a replica still starting or stopping
        serve.running["router"], serve.targets["router"] = 2, 2
        serve.settling = {"router"}
        busy.append(await watched.refresh())  # settling, but not one of the pools
        serve.settling, serve.error = set(), PICKLE_RACE
        busy.append(await watched.refresh())  # failed: nothing learnt
        return busy

    assert asyncio.run(go()) == [False, False, True, True, False, False]


def test_routers_learn_how_many_router_replicas_run_from_serve():
    serve = FakeServe()
    control = EdgeControl(POOLS, **serve.readers())

    async def go() -> list[int]:
        seen = [(await control.sync([])).routers]  # no router deployment read: one
        serve.running["router"], serve.targets["router"] = 2, 2
        await control.serve.refresh()
        seen.append((await control.sync([])).routers)
        serve.running["router"] = 0  # all restarting: the router asking still counts
        await control.serve.refresh()
        seen.append((await control.sync([])).routers)
        return seen

    assert asyncio.run(go()) == [1, 2, 1]


def test_the_pace_slows_down_while_nothing_happens_and_resumes_at_once():
    pacer = PollPacer(fast_s=0.5, idle_s=4.0)
    assert [pacer.after_read(busy=False) for _ in range(5)] == [1.0, 2.0, 4.0, 4.0, 4.0]
    assert pacer.idle
    assert pacer.after_read(busy=True) == 0.5 and not pacer.idle
    with pytest.raises(ValueError, match="fast_s <= idle_s"):
        PollPacer(fast_s=5.0, idle_s=1.0)


class RecordingPacer(PollPacer):
    """A pace far slower than any test (only traffic can bring a second read), recording each
    wait it sets."""

    def __init__(self) -> None:
        super().__init__(fast_s=1800.0, idle_s=3600.0)
        self.waits: list[float] = []
        self._paced = asyncio.Event()

    def after_read(self, busy: bool) -> float:
        self.waits.append(super().after_read(busy))
        self._paced.set()
        return self.waits[-1]

    async def paced(self, times: int) -> None:
        """Until the `times`-th wait was set (the poller is then waiting)."""
        while len(self.waits) < times:
            await self._paced.wait()
            self._paced.clear()


def test_traffic_reported_by_a_router_cuts_an_idle_wait_short():
    serve, pacer = FakeServe(), RecordingPacer()
    watched = view(serve, pacer)

    async def go() -> None:
        poller = asyncio.get_running_loop().create_task(watched.run())
        await pacer.paced(1)
        assert serve.reads == 1 and pacer.waits == [3600.0]  # nothing happening: the slow pace
        watched.note_traffic()
        await pacer.paced(2)
        assert serve.reads == 2 and pacer.waits == [3600.0, 1800.0]  # read now, then fast
        poller.cancel()

    asyncio.run(go())


def test_a_read_without_targets_keeps_the_last_targets_known():
    serve = FakeServe()
    control = EdgeControl(POOLS, **serve.readers())

    async def go() -> None:
        assert pools(await control.regions()) == {"eu": (1, 1, True), "ap": (0, 0, False)}
        # The fallback read (serve.status()) tells replicas but not targets.
        serve.running, serve.targets = {"glm-eu": 2, "glm-ap": 0}, {"glm-eu": None, "glm-ap": None}
        assert pools(await control.regions()) == {"eu": (2, 1, True), "ap": (0, 0, False)}

    asyncio.run(go())
