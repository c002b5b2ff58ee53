"""`edge-control`: the one place every router replica and model replica share edge state with.

- Routers call `sync(outcomes)` about twice a second: they hand over how their requests went
  (real failures, back-pressure, cold starts) and get back one snapshot of every region's pool:
  RUNNING replicas as Serve's controller reports them (polled here, at most ~0.5 s old), health,
  back-pressure marks, measured cold starts. `snapshot()` gives them the colo fault drills.
- Model replicas long-poll `region_faults(region, version)`: a region drill reaches the replicas
  themselves, which then fail the requests that reach them, so routers see real errors.
- Recent traffic: each router replica publishes its last minutes here, so the dashboard shows all
  of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from edge_sim.clock import Clock
from edge_sim.faults import ColoFault
from edge_sim.network import EdgeNetwork
from edge_sim.region_board import BoardSnapshot, Outcome, RegionBoard
from edge_sim.regions import RegionPolicy

SYNC_INTERVAL_S = 0.5
SERVE_POLL_INTERVAL_S = 0.5
FIRST_POLL_TIMEOUT_S = 2.0
FAULT_POLL_TIMEOUT_S = 30.0  # a replica's long poll returns at least this often
TRAFFIC_STALE_S = 10.0  # a replica that stopped publishing this long ago is gone

log = logging.getLogger("ray.serve")

FaultEntries = dict[str, list[dict[str, Any]]]  # id -> [{"fault": ColoFault json, "set_at": unix}]
Pools = dict[str, dict[str, str]]  # model -> region -> Serve deployment name


class FaultStore:
    """Admin-set faults per id (colo or region) with their wall-clock start, and a version that
    wakes long-polling readers on every change."""

    def __init__(self) -> None:
        self.entries: FaultEntries = {}
        self.version = 0
        self._changed = asyncio.Event()

    def set(self, key: str, fault: dict[str, Any]) -> int:
        self.entries[key] = [{"fault": fault, "set_at": time.time()}]
        return self._bump()

    def clear(self, key: str) -> int:
        self.entries[key] = []  # kept, so readers clear it too
        return self._bump()

    async def changed_since(self, version: int, timeout_s: float) -> None:
        while self.version == version:
            event = self._changed
            try:
                await asyncio.wait_for(event.wait(), timeout_s)
            except TimeoutError:
                return

    def _bump(self) -> int:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return self.version


class EdgeControl:
    """A Ray Serve deployment (one replica)."""

    def __init__(
        self,
        pools: Pools | None = None,
        policy: dict[str, Any] | None = None,
        default_cold_start_ms: float = 3000.0,
        clock: Clock = time.monotonic,
    ) -> None:
        self._pools = pools or {}
        regions = sorted({r for by_region in self._pools.values() for r in by_region})
        self._board = RegionBoard(
            list(self._pools),
            regions,
            RegionPolicy.model_validate(policy or {}),
            default_cold_start_ms,
            clock,
        )
        self._colo_faults = FaultStore()
        self._region_faults = FaultStore()
        self._poller: asyncio.Task[None] | None = None
        self._polled = asyncio.Event()
        self._traffic: dict[str, tuple[float, dict[str, Any]]] = {}

    # ---- routers ------------------------------------------------------------------------------

    async def sync(self, outcomes: list[Outcome]) -> BoardSnapshot:
        """Take a router's outcomes since its last sync; give it every region's pool state."""
        self._keep_polling()
        if not self._polled.is_set():
            # Right after a (re)start nothing is known yet: "all cold" would send requests to
            # cold regions that a warm one could serve. Wait for Serve's state, briefly.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._polled.wait(), FIRST_POLL_TIMEOUT_S)
        self._board.report(outcomes)
        return self._board.snapshot()

    async def snapshot(self) -> tuple[int, FaultEntries]:
        """The colo fault drills and their version."""
        return self._colo_faults.version, self._colo_faults.entries

    async def colo_faults(self, known_version: int) -> tuple[int, FaultEntries]:
        """Long poll for routers: returns when the colo drills changed since `known_version`,
        or after a while."""
        await self._colo_faults.changed_since(known_version, FAULT_POLL_TIMEOUT_S)
        return self._colo_faults.version, self._colo_faults.entries

    async def set_fault(self, colo_id: str, fault: dict[str, Any]) -> int:
        return self._colo_faults.set(colo_id, fault)

    async def clear_faults(self, colo_id: str) -> int:
        return self._colo_faults.clear(colo_id)

    async def set_region_fault(self, region: str, fault: dict[str, Any]) -> int:
        return self._region_faults.set(region, fault)

    async def clear_region_faults(self, region: str) -> int:
        return self._region_faults.clear(region)

    async def regions(self) -> list[dict[str, Any]]:
        """The admin view: per region and model, replicas running/wanted, health, faults."""
        self._keep_polling()
        await self._poll_serve(with_targets=True)
        now = time.time()
        described = self._board.describe()
        for region in described:
            region["faults"] = [
                describe_fault(entry, now)
                for entry in self._region_faults.entries.get(region["region"], [])
                if fault_window(entry, now)[1] > now
            ]
        return described

    async def report_traffic(self, replica_id: str, snapshot: dict[str, Any]) -> None:
        self._traffic[replica_id] = (time.monotonic(), snapshot)

    async def traffic(self) -> dict[str, dict[str, Any]]:
        """The latest snapshot of every router replica still publishing, by replica id."""
        oldest = time.monotonic() - TRAFFIC_STALE_S
        self._traffic = {r: entry for r, entry in self._traffic.items() if entry[0] >= oldest}
        return {replica: snapshot for replica, (_, snapshot) in self._traffic.items()}

    # ---- model replicas -----------------------------------------------------------------------

    async def region_faults(self, region: str, known_version: int) -> tuple[int, list[Any]]:
        """Long poll: returns when the drills changed since `known_version`, or after a while."""
        await self._region_faults.changed_since(known_version, FAULT_POLL_TIMEOUT_S)
        return self._region_faults.version, self._region_faults.entries.get(region, [])

    # ---- Serve's state ------------------------------------------------------------------------

    def _keep_polling(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    async def _poll_forever(self) -> None:
        while True:
            try:
                await self._poll_serve()
            except Exception:  # noqa: BLE001 - the controller may be busy; the next poll retries
                log.warning("edge-control: reading Serve's status failed", exc_info=True)
            await asyncio.sleep(SERVE_POLL_INTERVAL_S)

    async def _poll_serve(self, with_targets: bool = False) -> None:
        running, wanted = await asyncio.to_thread(read_replicas, self._pools, with_targets)
        self._board.set_replicas(running, wanted if with_targets else None)
        self._polled.set()


def read_replicas(
    pools: Pools, with_targets: bool
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
    """RUNNING (and, when asked, target) replicas per (model, region), from Serve's controller."""
    from ray import serve
    from ray.serve.context import _get_global_client
    from ray.serve.schema import ReplicaState

    app = serve.get_replica_context().app_name
    deployments = serve.status().applications[app].deployments
    running, wanted = {}, {}
    for model, by_region in pools.items():
        for region, name in by_region.items():
            status = deployments.get(name)
            running[(model, region)] = (
                status.replica_states.get(ReplicaState.RUNNING, 0) if status else 0
            )
    if with_targets:
        import ray

        client = _get_global_client()
        if client is None:  # only inside a Serve replica, which always has one
            raise RuntimeError("no Serve client in this process")
        controller = client._controller
        details = ray.get(controller.get_serve_instance_details.remote())
        listed = details["applications"][app]["deployments"]
        for model, by_region in pools.items():
            for region, name in by_region.items():
                wanted[(model, region)] = listed.get(name, {}).get("target_num_replicas", 0)
    return running, wanted


def fault_window(entry: dict[str, Any], now: float) -> tuple[float, float]:
    """(start, end) in unix time of a stored fault; end is inf for faults until cleared."""
    fault = ColoFault.model_validate(entry["fault"])
    start = entry["set_at"] + fault.start_after_s
    end = start + fault.duration_s if fault.duration_s is not None else float("inf")
    return start, end


def describe_fault(entry: dict[str, Any], now: float) -> dict[str, Any]:
    fault = ColoFault.model_validate(entry["fault"])
    start, end = fault_window(entry, now)
    return {
        **fault.model_dump(include={"down", "added_latency_ms", "error_rate"}),
        "active": start <= now < end,
        "starts_in_s": max(0.0, start - now),
        "ends_in_s": None if end == float("inf") else max(0.0, end - now),
    }


def apply_snapshot(network: EdgeNetwork, faults: FaultEntries, now: float | None = None) -> None:
    """Make the network's admin-managed colos match the store. Times are shifted by how long ago
    each fault was set, so every replica ends an outage window at the same moment."""
    now = time.time() if now is None else now
    for colo_id, entries in faults.items():
        network.clear_faults(colo_id)
        for entry in entries:
            fault = ColoFault.model_validate(entry["fault"])
            age = max(0.0, now - entry["set_at"])
            start_after = max(0.0, fault.start_after_s - age)
            duration = fault.duration_s
            if duration is not None:
                duration -= max(0.0, age - fault.start_after_s)
                if duration <= 0:
                    continue  # the window is over
            network.add_fault(
                colo_id,
                fault.model_copy(update={"start_after_s": start_after, "duration_s": duration}),
            )
