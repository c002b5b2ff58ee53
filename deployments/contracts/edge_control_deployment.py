"""The edge-control deployment's contract: the remote methods routers and model replicas call
(deployments.control.edge_control.EdgeControl), and the typed client a router's region pools
hold of its handle for the region-state sync."""

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
    """Edge-control's handle, typed, for what a router's region pools ask of it (the drills and
    the dashboard still call the handle: deployments.ingress.serving.drills)."""

    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self.handle = handle

    def sync(
        self, outcomes: list[Outcome], demand: Demand | None = None
    ) -> Awaitable[BoardSnapshot]:
        """Hand over this router's outcomes and demand; every pool's state in return."""
        return cast("Awaitable[BoardSnapshot]", self.handle.sync.remote(outcomes, demand))
