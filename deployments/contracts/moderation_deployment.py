"""The moderation deployment's contract: its request, the remote methods the router calls
(deployments.replica.batched.ModerationServer) and the typed client the router holds of its
handle, which can send concurrent requests as one grouped call (`classify_many`)."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from deployments.contracts.encoder_outputs import ModerationResult
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
class ClassifyRequest:
    """The texts to judge, one verdict each."""

    texts: list[str]
    traceparent: str | None = None


class ModerationServerProtocol(ModelServerProtocol, Protocol):
    async def classify(self, request: ClassifyRequest) -> Reply[list[ModerationResult]]: ...

    async def classify_many(
        self, requests: list[ClassifyRequest]
    ) -> GroupedReplies[list[ModerationResult]]:
        """Each request as `classify` answers it, in order; a request's error is its answer."""
        ...


class ModerationClient(ModelClient):
    """A moderation deployment's handle, typed. With a `coalesce`, `classify` sends the requests
    that come together as one `classify_many` call."""

    def __init__(self, handle: DeploymentHandle[Any], coalesce: Coalescer | None = None) -> None:
        super().__init__(handle)
        self._grouped = coalesce(self.classify_many) if coalesce is not None else None

    def classify(self, request: ClassifyRequest) -> Awaitable[Reply[list[ModerationResult]]]:
        if self._grouped is not None:
            return self._grouped(request)
        return cast(
            "Awaitable[Reply[list[ModerationResult]]]", self.handle.classify.remote(request)
        )

    def classify_many(
        self, requests: list[ClassifyRequest]
    ) -> Awaitable[GroupedReplies[list[ModerationResult]]]:
        return cast(
            "Awaitable[GroupedReplies[list[ModerationResult]]]",
            self.handle.classify_many.remote(requests),
        )
