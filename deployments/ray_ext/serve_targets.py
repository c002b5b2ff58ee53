"""The controller's target replicas per deployment (its autoscaling decision included).

No public Python API gives them: `serve.status()` carries replica states only. The dashboard's
REST API does (`GET /api/serve/applications/`, `target_num_replicas` per deployment), but a
replica would need the dashboard's address and the cluster's token, and that endpoint is this
same controller call behind one more process. So this reads the document that endpoint serves
through Serve's private client, `_get_global_client().get_serve_details()`, and parses it as
plain JSON (no pydantic: nothing of `serve_status`'s thread-safety bug). Where the pinned Ray
lacks the call, or the document lost its shape, `TargetsUnavailable` says so: callers keep the
last targets they read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


class TargetsUnavailable(RuntimeError):
    """This Ray cannot tell the controller's targets, or its answer had an unexpected shape."""


def details_call() -> Callable[[], Mapping[str, Any]] | None:
    """Serve's private `get_serve_details` of the process's client, or None where this Ray
    Serve has no such function or method (found without connecting to anything)."""
    try:
        from ray.serve._private.client import ServeControllerClient
        from ray.serve.context import _get_global_client
    except ImportError:
        return None
    if not callable(getattr(ServeControllerClient, "get_serve_details", None)):
        return None

    def get_serve_details() -> Mapping[str, Any]:
        client = _get_global_client()
        if client is None:  # only outside Serve: every replica has a client
            raise TargetsUnavailable("no Serve client in this process")
        details: Mapping[str, Any] = client.get_serve_details()
        return details

    return get_serve_details


def target_replicas(
    app: str, get_details: Callable[[], Mapping[str, Any]] | None = None
) -> Mapping[str, int]:
    """Target replicas of each deployment of application `app`. Blocking: call it from a worker
    thread. Raises TargetsUnavailable, or what the controller call raised."""
    read = get_details or details_call()
    if read is None:
        raise TargetsUnavailable("this Ray Serve has no get_serve_details on its client")
    return parse_targets(read(), app)


def parse_targets(details: Any, app: str) -> dict[str, int]:
    """`target_num_replicas` per deployment out of a ServeInstanceDetails document."""
    try:
        deployments = details["applications"][app]["deployments"]
        return {name: int(d["target_num_replicas"]) for name, d in deployments.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TargetsUnavailable(
            f"Serve's details for application {app!r} lack {exc!r}: has Ray changed them?"
        ) from None
