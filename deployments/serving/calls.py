"""The boundary of a model call: whatever a handle raised becomes the one error a client sees."""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import TypeVar

from deployments.errors import InternalServerError, OverloadedError, QueueFullError, ServingError

log = logging.getLogger("ray.serve")
T = TypeVar("T")


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


async def resolve(response: Awaitable[T]) -> T:
    """Await a model call, turning whatever it raised into the one client-visible error (a 5xx
    one lets the edge fail over)."""
    try:
        return await response
    except ServingError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped, so the edge can fail over on 5xx
        raise as_serving_error(exc) from None
