"""The warm pool deployment's contract: the remote methods the router calls
(deployments.control.warm_pool.WarmPool) and the typed client it holds of its handle."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle


class WarmPoolProtocol(Protocol):
    async def top_up(self) -> None:
        """Replace the worker a cold start took now, not at the pool's next check."""
        ...

    async def describe(self) -> dict[str, Any]: ...


class WarmPoolClient:
    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self.handle = handle

    def top_up(self) -> Awaitable[None]:
        return cast("Awaitable[None]", self.handle.top_up.remote())

    def describe(self) -> Awaitable[dict[str, Any]]:
        return cast("Awaitable[dict[str, Any]]", self.handle.describe.remote())
