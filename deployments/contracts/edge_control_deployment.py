"""The edge-control deployment's contract: the remote methods routers and model replicas call
(deployments.control.edge_control.EdgeControl), and the typed client both hold of its handle."""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

from deployments.contracts.faults import FaultEntries
from edge_sim.region_board import BoardSnapshot, Outcome

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

Demand = Mapping[tuple[str, str], int]  # requests per (model, the region of their entry colo)


class EdgeControlProtocol(Protocol):
    # routers: region state, colo drills, the dashboard's traffic
    async def sync(
        self, outcomes: list[Outcome], demand: Demand | None = None
    ) -> BoardSnapshot: ...

    async def snapshot(self) -> tuple[int, FaultEntries]: ...

    async def colo_faults(self, known_version: int) -> tuple[int, FaultEntries]: ...

    async def set_fault(self, colo_id: str, fault: dict[str, Any]) -> int: ...

    async def clear_faults(self, colo_id: str) -> int: ...

    async def set_region_fault(self, region: str, fault: dict[str, Any]) -> int: ...

    async def clear_region_faults(self, region: str) -> int: ...

    async def regions(self) -> list[dict[str, Any]]: ...

    async def report_traffic(self, replica_id: str, snapshot: dict[str, Any]) -> None: ...

    async def traffic(self) -> dict[str, dict[str, Any]]: ...

    # model replicas: their region's drills
    async def region_faults(self, region: str, known_version: int) -> tuple[int, list[Any]]: ...


class EdgeControlClient:
    """Edge-control's handle, typed: one method per remote method, as EdgeControlProtocol
    declares it. The router's region pools, fault drills and dashboard hold one; so does a model
    replica's fault gate. Each returns the call's awaitable (a Ray Serve response)."""

    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self.handle = handle

    # ---- routers ------------------------------------------------------------------------------

    def sync(
        self, outcomes: list[Outcome], demand: Demand | None = None
    ) -> Awaitable[BoardSnapshot]:
        """Hand over this router's outcomes and demand; every pool's state in return."""
        return cast("Awaitable[BoardSnapshot]", self.handle.sync.remote(outcomes, demand))

    def snapshot(self) -> Awaitable[tuple[int, FaultEntries]]:
        """The colo drills now, with their version."""
        return cast("Awaitable[tuple[int, FaultEntries]]", self.handle.snapshot.remote())

    def colo_faults(self, known_version: int) -> Awaitable[tuple[int, FaultEntries]]:
        """The colo drills once they differ from `known_version` (a long poll)."""
        return cast(
            "Awaitable[tuple[int, FaultEntries]]", self.handle.colo_faults.remote(known_version)
        )

    def set_fault(self, colo_id: str, fault: dict[str, Any]) -> Awaitable[int]:
        return cast("Awaitable[int]", self.handle.set_fault.remote(colo_id, fault))

    def clear_faults(self, colo_id: str) -> Awaitable[int]:
        return cast("Awaitable[int]", self.handle.clear_faults.remote(colo_id))

    def set_region_fault(self, region: str, fault: dict[str, Any]) -> Awaitable[int]:
        return cast("Awaitable[int]", self.handle.set_region_fault.remote(region, fault))

    def clear_region_faults(self, region: str) -> Awaitable[int]:
        return cast("Awaitable[int]", self.handle.clear_region_faults.remote(region))

    def regions(self) -> Awaitable[list[dict[str, Any]]]:
        return cast("Awaitable[list[dict[str, Any]]]", self.handle.regions.remote())

    def report_traffic(self, replica_id: str, snapshot: dict[str, Any]) -> Awaitable[None]:
        return cast("Awaitable[None]", self.handle.report_traffic.remote(replica_id, snapshot))

    def traffic(self) -> Awaitable[dict[str, dict[str, Any]]]:
        """Every router replica's latest traffic snapshot, by replica id."""
        return cast("Awaitable[dict[str, dict[str, Any]]]", self.handle.traffic.remote())

    # ---- model replicas -----------------------------------------------------------------------

    def region_faults(self, region: str, known_version: int) -> Awaitable[tuple[int, list[Any]]]:
        """The region's drills once they differ from `known_version` (a long poll)."""
        return cast(
            "Awaitable[tuple[int, list[Any]]]",
            self.handle.region_faults.remote(region, known_version),
        )
