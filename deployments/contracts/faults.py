"""Fault drills as they cross a Ray call: edge-control hands every router and model replica one
snapshot of the admin-set faults (`FaultEntries`), and each reads it here the same way, so every
replica starts and ends a drill's window at the same moment."""

from __future__ import annotations

import time
from typing import Any

from edge_sim.faults import ColoFault
from edge_sim.network import EdgeNetwork

SYNC_INTERVAL_S = 0.5  # how often a busy router syncs with edge-control

FaultEntries = dict[str, list[dict[str, Any]]]  # id -> [{"fault": ColoFault json, "set_at": unix}]


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
