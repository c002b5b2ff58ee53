"""The front spare deployment's contract: the remote method the router calls
(deployments.control.front_spare.FrontSpare) and the typed client it holds of its handle."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle


class FrontSpareProtocol(Protocol):
    async def describe(self) -> dict[str, Any]:
        """Whether the spare HAProxy runs, its pid, starts and last error."""
        ...


class FrontSpareClient:
    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self.handle = handle

    def describe(self) -> Awaitable[dict[str, Any]]:
        return cast("Awaitable[dict[str, Any]]", self.handle.describe.remote())
