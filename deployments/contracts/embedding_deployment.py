"""The embedding deployment's contract: its request, the remote methods the router calls
(deployments.replica.batched.EmbeddingServer) and the typed client the router holds of its
handle, which can send concurrent requests as one grouped call (`embed_many`)."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from deployments.contracts.encoder_outputs import EmbeddingResult
from deployments.contracts.model_deployment import (
    Coalescer,
    GroupedReplies,
    ModelClient,
    ModelServerProtocol,
)
from deployments.contracts.replies import Reply

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle


@dataclass(frozen=True)
class EmbedRequest:
    """The texts to embed; `dimensions`, when the client asked for some, must be the model's
    (the replica checks it before any inference runs)."""

    texts: list[str]
    traceparent: str | None = None
    dimensions: int | None = None


class EmbeddingServerProtocol(ModelServerProtocol, Protocol):
    async def embed(self, request: EmbedRequest) -> Reply[EmbeddingResult]: ...

    async def embed_many(self, requests: list[EmbedRequest]) -> GroupedReplies[EmbeddingResult]:
        """Each request as `embed` answers it, in order; a request's error is its answer."""
        ...


class EmbeddingClient(ModelClient):
    """An embedding deployment's handle, typed. With a `coalesce`, `embed` sends the requests
    that come together as one `embed_many` call."""

    def __init__(self, handle: DeploymentHandle[Any], coalesce: Coalescer | None = None) -> None:
        super().__init__(handle)
        self._grouped = coalesce(self.embed_many) if coalesce is not None else None

    def embed(self, request: EmbedRequest) -> Awaitable[Reply[EmbeddingResult]]:
        if self._grouped is not None:
            return self._grouped(request)
        return cast("Awaitable[Reply[EmbeddingResult]]", self.handle.embed.remote(request))

    def embed_many(
        self, requests: list[EmbedRequest]
    ) -> Awaitable[GroupedReplies[EmbeddingResult]]:
        return cast(
            "Awaitable[GroupedReplies[EmbeddingResult]]", self.handle.embed_many.remote(requests)
        )
