"""Fault drills of the admin API. With edge-control (the Serve app), a fault is recorded there and
every router replica applies it on its next sync; without it (tests), it is applied here. An
edge-control that does not answer (restarting, its node gone) is a 503 naming it; the colo view
then shows what this router last applied."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException

from deployments.contracts.edge_control_deployment import EdgeControlClient
from deployments.contracts.faults import SYNC_INTERVAL_S, FaultEntries, apply_snapshot
from deployments.errors import (
    ColoNotFoundError,
    ControlUnavailableError,
    RegionNotFoundError,
    ServingError,
)
from edge_sim.faults import ColoFault
from edge_sim.network import EdgeNetwork

log = logging.getLogger("ray.serve")

# An admin call waits this long for edge-control: with its node gone (and the GCS with it, when
# that node is the head) a call is not refused, it hangs.
CONTROL_TIMEOUT_S = 10.0
P = ParamSpec("P")
T = TypeVar("T")


class FaultDrills:
    def __init__(
        self,
        network: EdgeNetwork,
        control: EdgeControlClient | None = None,
        regions: tuple[str, ...] = (),
    ):
        self.network = network
        self.regions = regions
        self._control = control  # the edge-control deployment's client
        self._version = 0

    async def sync(self) -> None:
        """Apply edge-control's faults if they changed since the last sync."""
        if self._control is None:
            return
        self._apply(*await self._ask(self._control.snapshot))

    async def sync_forever(self) -> None:
        """Follow edge-control's drills by long poll: a change applies at once, and an idle
        router makes one call per poll timeout instead of a Ray Serve call every 0.5 s (each costs
        the router milliseconds of CPU)."""
        if self._control is None:
            return
        while True:
            try:
                self._apply(*await self._control.colo_faults(self._version))
            except Exception:  # noqa: BLE001 - a missed sync is retried; routing goes on
                log.warning("fault sync with edge-control failed", exc_info=True)
                await asyncio.sleep(SYNC_INTERVAL_S)

    def _apply(self, version: int, faults: FaultEntries) -> None:
        if version != self._version:
            apply_snapshot(self.network, faults)
            self._version = version

    async def colos(self) -> list[dict[str, Any]]:
        """The colos as this router routes them: with edge-control's latest drills when it
        answers, else with those it last applied (real state: what routing uses)."""
        try:
            await self.sync()
        except ControlUnavailableError:
            log.warning("edge-control did not answer; the colos as last synced", exc_info=True)
        return self.network.colo_states()

    async def set_fault(self, colo_id: str, fault: ColoFault) -> dict[str, Any]:
        colo = self._known_colo(colo_id)
        if self._control is None:
            self.network.set_fault(colo, fault)
        else:
            await self._ask(self._control.set_fault, colo, fault.model_dump(mode="json"))
            await self.sync()
        return self._colo_state(colo)

    async def clear_faults(self, colo_id: str) -> dict[str, Any]:
        colo = self._known_colo(colo_id)
        if self._control is None:
            self.network.clear_faults(colo)
        else:
            await self._ask(self._control.clear_faults, colo)
            await self.sync()
        return self._colo_state(colo)

    # ---- regions: drills injected in the replicas themselves ----------------------------------

    async def region_states(self) -> list[dict[str, Any]]:
        """Per region: replicas running/wanted per model, health, back-pressure and drills (from
        edge-control; empty without it)."""
        if self._control is None:
            return []
        return await self._ask(self._control.regions)

    async def set_region_fault(self, region: str, fault: ColoFault) -> list[dict[str, Any]]:
        """The region's replicas fail (or slow down) the requests that reach them."""
        control = self._known_region(region)
        await self._ask(control.set_region_fault, region, fault.model_dump(mode="json"))
        return await self.region_states()

    async def clear_region_faults(self, region: str) -> list[dict[str, Any]]:
        control = self._known_region(region)
        await self._ask(control.clear_region_faults, region)
        return await self.region_states()

    def _known_region(self, region: str) -> EdgeControlClient:
        """The client its drills go through, once `region` is known and edge-control is there."""
        if region not in self.regions:
            raise RegionNotFoundError(
                f"unknown region {region!r}; known: {list(self.regions)}", param="region"
            )
        if self._control is None:
            raise RegionNotFoundError("region drills need the edge-control deployment")
        return self._control

    @staticmethod
    async def _ask(method: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """One call to edge-control (a method of its client). Its errors of our own pass through
        (a 4xx stays one); its being gone, restarting or hung is a 503 that names the method,
        never a 500."""
        try:
            return await asyncio.wait_for(method(*args, **kwargs), CONTROL_TIMEOUT_S)
        except ServingError:
            raise
        except (RayError, RayServeException, TimeoutError) as error:
            raise ControlUnavailableError(
                f"edge-control did not answer {method.__name__} ({type(error).__name__}); "
                "serving goes on, retry the admin call",
                retry_after_s=SYNC_INTERVAL_S,
            ) from None

    def _known_colo(self, colo_id: str) -> str:
        colo = colo_id.upper()
        if colo not in self.network.topology.ids:
            raise ColoNotFoundError(f"unknown colo {colo_id!r}", param="colo_id")
        return colo

    def _colo_state(self, colo: str) -> dict[str, Any]:
        return next(state for state in self.network.colo_states() if state["id"] == colo)
