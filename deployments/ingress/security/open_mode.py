"""May the router start with no API key? On a developer's machine an open API is a convenience
(warned about at start); on Kubernetes a Service can put it in front of a whole network, so it
takes an explicit `security.allow_open: true`."""

from __future__ import annotations

from collections.abc import Mapping

# The kubelet sets this in every container of every pod: the one signal that needs no API call.
KUBERNETES_ENV = "KUBERNETES_SERVICE_HOST"


def on_kubernetes(environ: Mapping[str, str]) -> bool:
    return bool(environ.get(KUBERNETES_ENV, "").strip())


def open_start_refusal(
    environ: Mapping[str, str], *, has_keys: bool, allow_open: bool
) -> str | None:
    """Why the router must not start open, in one line; None when it may start."""
    if has_keys or allow_open or not on_kubernetes(environ):
        return None
    return (
        f"on Kubernetes ({KUBERNETES_ENV} is set) an API with no key is open to anyone who can "
        "reach its Service"
    )
