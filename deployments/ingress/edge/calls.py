"""A model call as a value (a typed client's method and its request, unary or streamed) that
the dispatcher runs on the client of the region it picks, and the boundary of that call: whatever
the deployment raised becomes the one serving error a client sees."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from deployments.contracts.model_deployment import ModelClient, ReplyStream
from deployments.contracts.replies import Reply
from deployments.errors import InternalServerError, OverloadedError, QueueFullError, ServingError

log = logging.getLogger("ray.serve")
ClientT = TypeVar("ClientT", bound=ModelClient)
RequestT = TypeVar("RequestT")


@dataclass(frozen=True)
class CallResult:
    """What a model call gave: its reply (a stream's first one) and, for a stream, the rest."""

    reply: Reply[Any]
    rest: Any = None  # a stream's ReplyStream of Replies after `reply` (Any: read as a stream)

    def close(self) -> None:
        """Free the model's slot held by a stream nobody will read on."""
        if self.rest is not None:
            self.rest.cancel()


@dataclass(frozen=True)
class ModelCall(Generic[ClientT, RequestT]):
    """`method(client, request)`, e.g. `ChatClient.complete_choices` with its ChatRequest, as a
    value: built by a service, run by the dispatcher on one region's client (and again on the next
    region's if that one fails). A call with a `session` goes to that session's replica of the
    pool (deployments.contracts.session_router). The unary form; StreamCall opens a stream.

    The types pair the method with its request; `run` takes any model's client, since the pools
    hold them all: the catalogue sent the request only to a model of the method's task."""

    method: Callable[[ClientT, RequestT], Awaitable[Reply[Any]]]
    request: RequestT
    session: str = ""

    async def run(self, client: ModelClient) -> CallResult:
        """Call the method and await its reply."""
        try:
            return CallResult(await self.method(_routed(client, self.session), self.request))
        except ServingError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped, so the edge can fail over on 5xx
            raise as_serving_error(exc) from None


@dataclass(frozen=True)
class StreamCall(Generic[ClientT, RequestT]):
    """A streaming method (`ChatClient.stream`) and its request, as ModelCall: the stream is
    opened and its first reply awaited, the proof that the region answers (until then the edge
    may still fail over)."""

    method: Callable[[ClientT, RequestT], ReplyStream[Reply[Any]]]
    request: RequestT
    session: str = ""

    async def run(self, client: ModelClient) -> CallResult:
        try:
            response = self.method(_routed(client, self.session), self.request)
            try:
                return CallResult(await response.__anext__(), response)
            except BaseException:
                response.cancel()
                raise
        except ServingError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped, so the edge can fail over on 5xx
            raise as_serving_error(exc) from None


AnyCall = ModelCall[Any, Any] | StreamCall[Any, Any]  # what the dispatcher runs


def _routed(client: ModelClient, session: str) -> Any:
    """The client (of the call's type), routed to `session`'s replica if the call has one."""
    return client.in_session(session) if session else client


def as_serving_error(exc: BaseException) -> ServingError:
    """Whatever a model call raised, as the one error the client should see."""
    from ray import exceptions as ray_exceptions
    from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

    cause = getattr(exc, "cause", None)  # RayTaskError wraps what the replica raised
    if isinstance(cause, ServingError):
        return cause
    if isinstance(exc, ServingError):
        return exc
    if isinstance(exc, BackPressureError):
        return QueueFullError("the model's queue is full; retry shortly", retry_after_s=1)
    if isinstance(exc, DeploymentUnavailableError):
        return OverloadedError("the model is not available right now", retry_after_s=5)
    if isinstance(exc, TimeoutError | ray_exceptions.GetTimeoutError):
        return OverloadedError("the model did not answer in time", retry_after_s=2)
    if isinstance(exc, ray_exceptions.RayActorError | ray_exceptions.ActorDiedError):
        return OverloadedError("the model replica died; retry", retry_after_s=1)
    log.exception("unexpected error from a model call", exc_info=exc)
    return InternalServerError("internal error while serving the request")
