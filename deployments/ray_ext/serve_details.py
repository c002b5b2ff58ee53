"""Serve's replicas per deployment, for edge-control's view of which regions are warm (RUNNING
replicas, the controller's target, and whether some are starting or stopping) and the router's
/readyz (each deployment's status and replicas by state).

The public way, `serve.status()` (`serve_status`), is the fallback only, for two reasons measured
on Ray 2.60: it carries no targets, and it validates the controller's answer into pydantic models
in the calling process, where each deployment's request router class and autoscaling policy are
re-pickled by value: 278 ms of CPU per call for an answer of our app's 15 deployments, against
2.7 ms for the plain JSON read below (2-core machine, load 12). Read, then 0.5 s of sleep, over
and over: that was the third of a core edge-control burnt with no traffic at all. The same answer
is what the dashboard's public REST API serves (`GET /api/serve/applications/`), but a replica
would need the dashboard's address and the cluster's token to ask it, and it is this same
controller call behind one more process. So this reads it through Serve's private client,
`_get_global_client().get_serve_details()`, and parses it as plain JSON.

Feature-detected: where this Ray Serve lacks that call, or its answer lost the shape read here,
`read_deployments` falls back to `serve.status()` (targets then unknown) and logs why, once.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from deployments.ray_ext.serve_status import serve_status

log = logging.getLogger("ray.serve")


@dataclass(frozen=True, slots=True)
class DeploymentReplicas:
    running: int  # RUNNING replicas
    target: int | None  # the controller's target (its autoscaling decision); None: unknown
    settling: bool  # a replica is starting or stopping, or the deployment is not yet healthy
    # What /readyz and the dashboard show; not compared: a view changes with the counts above.
    status: str = field(default="HEALTHY", compare=False)  # Serve's deployment status
    replica_states: Mapping[str, int] = field(default_factory=dict, compare=False)


class ServeDetailsChanged(RuntimeError):
    """Serve's details no longer have the shape read here: has Ray changed them?"""


def details_call() -> Callable[[], Mapping[str, Any]] | None:
    """Serve's private `get_serve_details` of this process's client, or None where this Ray
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
            raise RuntimeError("no Serve client in this process")
        details: Mapping[str, Any] = client.get_serve_details()
        return details

    return get_serve_details


class DeploymentReader:
    """Reads application `app`'s deployments: by `get_details` (default: the private call
    above, looked up on the first read) while it works, else by the public `serve.status()`.
    Blocking: run it in a thread."""

    def __init__(
        self,
        app: str | Callable[[], str],
        get_details: Callable[[], Mapping[str, Any]] | None = None,
        status: Callable[[], Any] = serve_status,
    ) -> None:
        self._app = app
        self._get_details = get_details
        self._looked_up = get_details is not None
        self._status = status

    def __call__(self) -> dict[str, DeploymentReplicas]:
        app = self._app if isinstance(self._app, str) else self._app()
        if not self._looked_up:
            self._looked_up = True
            self._get_details = details_call()
            if self._get_details is None:
                log.warning("Ray Serve changed: no get_serve_details; reading serve.status()")
        if self._get_details is not None:
            details = self._get_details()  # its errors are the caller's to handle
            try:
                return parse_details(details, app)
            except ServeDetailsChanged:
                log.warning("reading serve.status() from now on", exc_info=True)
                self._get_details = None
        return from_status(self._status(), app)


def parse_details(details: Any, app: str) -> dict[str, DeploymentReplicas]:
    """The deployments of application `app` in a ServeInstanceDetails document (plain JSON).
    Raises LookupError when Serve has no such application, ServeDetailsChanged when the
    document lost the fields read here."""
    try:
        applications = details["applications"]
    except (KeyError, TypeError) as exc:
        raise ServeDetailsChanged(f"Serve's details have no applications ({exc!r})") from None
    if app not in applications:
        raise LookupError(f"Serve has no application {app!r} (has {sorted(applications)})")
    try:
        return {
            name: _replicas(deployment)
            for name, deployment in applications[app]["deployments"].items()
        }
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ServeDetailsChanged(
            f"Serve's details for application {app!r} lack {exc!r}: has Ray changed them?"
        ) from None


def _replicas(deployment: Mapping[str, Any]) -> DeploymentReplicas:
    states = [replica["state"] for replica in deployment["replicas"]]
    return DeploymentReplicas(
        running=states.count("RUNNING"),
        target=int(deployment["target_num_replicas"]),
        settling=deployment["status"] != "HEALTHY" or any(s != "RUNNING" for s in states),
        status=str(deployment["status"]),
        replica_states=dict(Counter(states)),
    )


def from_status(status: Any, app: str) -> dict[str, DeploymentReplicas]:
    """The deployments of application `app` in a `serve.status()` answer (no targets there)."""
    application = status.applications.get(app)
    if application is None:
        raise LookupError(f"Serve has no application {app!r} (has {sorted(status.applications)})")
    return {
        name: DeploymentReplicas(
            running=deployment.replica_states.get("RUNNING", 0),
            target=None,
            settling=str(deployment.status.value) != "HEALTHY"
            or any(state != "RUNNING" for state in deployment.replica_states),
            status=str(deployment.status.value),
            replica_states={
                str(getattr(state, "value", state)): n
                for state, n in deployment.replica_states.items()
            },
        )
        for name, deployment in application.deployments.items()
    }
