"""State shared by every router replica. Fault drills: an admin call reaches one router replica;
it records the fault here, and every replica applies this store's state on its next sync, so a
colo marked down is down for the whole router, however many replicas it runs. Recent traffic:
each replica publishes its last minutes here, so the dashboard shows all of them."""

from __future__ import annotations

import time
from typing import Any

from edge_sim.faults import ColoFault
from edge_sim.network import EdgeNetwork

SYNC_INTERVAL_S = 0.5
TRAFFIC_STALE_S = 10.0  # a replica that stopped publishing this long ago is gone


class EdgeControl:
    """A Ray Serve deployment (one replica): admin-set faults with their wall-clock start."""

    def __init__(self) -> None:
        self._faults: dict[str, list[dict[str, Any]]] = {}
        self._version = 0
        self._traffic: dict[str, tuple[float, dict[str, Any]]] = {}

    async def set_fault(self, colo_id: str, fault: dict[str, Any]) -> int:
        self._faults[colo_id] = [{"fault": fault, "set_at": time.time()}]
        self._version += 1
        return self._version

    async def clear_faults(self, colo_id: str) -> int:
        self._faults[colo_id] = []  # kept, so replicas clear it too
        self._version += 1
        return self._version

    async def snapshot(self) -> tuple[int, dict[str, list[dict[str, Any]]]]:
        return self._version, self._faults

    async def report_traffic(self, replica_id: str, snapshot: dict[str, Any]) -> None:
        self._traffic[replica_id] = (time.monotonic(), snapshot)

    async def traffic(self) -> dict[str, dict[str, Any]]:
        """The latest snapshot of every router replica still publishing, by replica id."""
        oldest = time.monotonic() - TRAFFIC_STALE_S
        self._traffic = {r: entry for r, entry in self._traffic.items() if entry[0] >= oldest}
        return {replica: snapshot for replica, (_, snapshot) in self._traffic.items()}


def apply_snapshot(
    network: EdgeNetwork, faults: dict[str, list[dict[str, Any]]], now: float | None = None
) -> None:
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
