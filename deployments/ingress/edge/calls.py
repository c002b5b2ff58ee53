"""A model call as a value (which method of the model's deployment, its arguments, streamed or
not) that the dispatcher runs on the handle of the region it picks, and the boundary of that call:
whatever the handle raised becomes the one serving error a client sees."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from deployments.contracts.replies import Reply
from deployments.errors import InternalServerError, OverloadedError, QueueFullError, ServingError

log = logging.getLogger("ray.serve")
Handle = Any  # a DeploymentHandle (or a test double with the same methods)


@dataclass(frozen=True)
class CallResult:
    """What a model call gave: its reply (a stream's first one) and, for a stream, the rest."""

    reply: Reply[Any]
    rest: Any = None  # a stream's DeploymentResponseGenerator of Replies, after `reply`

    def close(self) -> None:
        """Free the model's slot held by a stream nobody will read on."""
        if self.rest is not None:
            self.rest.cancel()


@dataclass(frozen=True)
class HandleCall:
    """`handle.<method>.remote(*args)` on a model deployment's handle, as a value: built by a
    service, run by the dispatcher on one region's handle (and again on the next region's if that
    one fails). A `stream` call runs on the handle's streaming form; a call with a `session`
    goes to that session's replica of the pool (deployments.contracts.session_router)."""

    method: str
    args: tuple[Any, ...] = ()
    stream: bool = False
    session: str = ""

    async def run(self, handle: Handle) -> CallResult:
        """Call the method and await its reply; a stream is opened and its first reply awaited,
        the proof that the region answers (until then the edge may still fail over)."""
        try:
            if self.session:
                handle = handle.options(session_id=self.session)  # shares the handle's router
            response = getattr(handle, self.method).remote(*self.args)
            if not self.stream:
                return CallResult(await response)
            try:
                return CallResult(await response.__anext__(), response)
            except BaseException:
                response.cancel()
                raise
        except ServingError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped, so the edge can fail over on 5xx
            raise as_serving_error(exc) from None


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
