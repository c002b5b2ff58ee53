"""What every model deployment answers (wake, hold, describe): its Protocol, and the typed client
of a deployment's handle that the chat, embedding and moderation clients build on."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar, cast

from deployments.contracts.replies import Reply
from deployments.errors import ServingError

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

T = TypeVar("T")
RequestT = TypeVar("RequestT")
ReplyT = TypeVar("ReplyT", covariant=True)

# A grouped call's answer: one reply per request, in order, or the error of that request alone.
GroupedReplies = list[Reply[T] | ServingError]


class ModelServerProtocol(Protocol):
    """The remote methods every model replica has (deployments.replica.base.ModelServer)."""

    async def wake(self) -> float: ...

    async def hold(self, seconds: float) -> float: ...

    async def describe(self) -> dict[str, Any]: ...


class ReplyStream(Protocol[ReplyT]):
    """A streaming call's answer (Serve's DeploymentResponseGenerator): its replies, one by one,
    and `cancel` to free the replica's slot when nobody reads on."""

    def __aiter__(self) -> AsyncIterator[ReplyT]: ...

    async def __anext__(self) -> ReplyT: ...

    def cancel(self) -> None: ...


class Coalescer(Protocol):
    """Turns a deployment's grouped method (`embed_many`) into a one-request call whose concurrent
    requests leave together in one grouped call (deployments.ingress.edge.coalesce)."""

    def __call__(
        self, send_group: Callable[[list[RequestT]], Awaitable[GroupedReplies[T]]]
    ) -> Callable[[RequestT], Awaitable[Reply[T]]]: ...


class ModelClient:
    """A model deployment's DeploymentHandle, typed: each remote method is a method here taking
    the method's request type, so a call cannot name a method the replica lacks or pass its
    arguments in the wrong order. Unary methods return Serve's DeploymentResponse (awaitable),
    so the client adds no coroutine to a call."""

    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        self.handle = handle

    def in_session(self, session: str) -> Self:
        """This client with its calls routed to `session`'s replica (Serve's `session_id` option,
        read by deployments.contracts.session_router); the original stays as it was."""
        routed = copy.copy(self)
        routed.handle = self.handle.options(session_id=session)  # shares the handle's router
        return routed

    def wake(self) -> Awaitable[float]:
        return cast("Awaitable[float]", self.handle.wake.remote())

    def hold(self, seconds: float) -> Awaitable[float]:
        return cast("Awaitable[float]", self.handle.hold.remote(seconds))

    def describe(self) -> Awaitable[dict[str, Any]]:
        return cast("Awaitable[dict[str, Any]]", self.handle.describe.remote())
