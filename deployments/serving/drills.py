"""Fault drills of the admin API. With edge-control (the Serve app), a fault is recorded there and
every router replica applies it on its next sync; without it (tests), it is applied here."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from deployments.edge_control import SYNC_INTERVAL_S, FaultEntries, apply_snapshot
from deployments.errors import ColoNotFoundError, RegionNotFoundError
from edge_sim.faults import ColoFault
from edge_sim.network import EdgeNetwork

log = logging.getLogger("ray.serve")


class FaultDrills:
    def __init__(
        self, network: EdgeNetwork, control: Any | None = None, regions: tuple[str, ...] = ()
    ):
        self.network = network
        self.regions = regions
        self._control = control  # the edge-control deployment's handle
        self._version = 0

    async def sync(self) -> None:
        """Apply edge-control's faults if they changed since the last sync."""
        if self._control is None:
            return
        self._apply(*await self._control.snapshot.remote())

    async def sync_forever(self) -> None:
        """Follow edge-control's drills by long poll: a change applies at once, and an idle
        router makes one call per poll timeout instead of a Ray Serve call every 0.5 s (each costs
        the router milliseconds of CPU)."""
        if self._control is None:
            return
        while True:
            try:
                self._apply(*await self._control.colo_faults.remote(self._version))
            except Exception:  # noqa: BLE001 - a missed sync is retried; routing goes on
                log.warning("fault sync with edge-control failed", exc_info=True)
                await asyncio.sleep(SYNC_INTERVAL_S)

    def _apply(self, version: int, faults: FaultEntries) -> None:
        if version != self._version:
            apply_snapshot(self.network, faults)
            self._version = version

    async def colos(self) -> list[dict[str, Any]]:
        await self.sync()
        return self.network.colo_states()

    async def set_fault(self, colo_id: str, fault: ColoFault) -> dict[str, Any]:
        colo = self._known_colo(colo_id)
        if self._control is None:
            self.network.set_fault(colo, fault)
        else:
            await self._control.set_fault.remote(colo, fault.model_dump(mode="json"))
            await self.sync()
        return self._colo_state(colo)

    async def clear_faults(self, colo_id: str) -> dict[str, Any]:
        colo = self._known_colo(colo_id)
        if self._control is None:
            self.network.clear_faults(colo)
        else:
            await self._control.clear_faults.remote(colo)
            await self.sync()
        return self._colo_state(colo)

    # ---- regions: drills injected in the replicas themselves ----------------------------------

    async def region_states(self) -> list[dict[str, Any]]:
        """Per region: replicas running/wanted per model, health, back-pressure and drills (from
        edge-control; empty without it)."""
        if self._control is None:
            return []
        states: list[dict[str, Any]] = await self._control.regions.remote()
        return states

    async def set_region_fault(self, region: str, fault: ColoFault) -> list[dict[str, Any]]:
        """The region's replicas fail (or slow down) the requests that reach them."""
        await self._region_control(region).set_region_fault.remote(
            region, fault.model_dump(mode="json")
        )
        return await self.region_states()

    async def clear_region_faults(self, region: str) -> list[dict[str, Any]]:
        await self._region_control(region).clear_region_faults.remote(region)
        return await self.region_states()

    def _region_control(self, region: str) -> Any:
        if region not in self.regions:
            raise RegionNotFoundError(
                f"unknown region {region!r}; known: {list(self.regions)}", param="region"
            )
        if self._control is None:
            raise RegionNotFoundError("region drills need the edge-control deployment")
        return self._control

    def _known_colo(self, colo_id: str) -> str:
        colo = colo_id.upper()
        if colo not in self.network.topology.ids:
            raise ColoNotFoundError(f"unknown colo {colo_id!r}", param="colo_id")
        return colo

    def _colo_state(self, colo: str) -> dict[str, Any]:
        return next(state for state in self.network.colo_states() if state["id"] == colo)
