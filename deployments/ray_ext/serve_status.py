"""Serve's public `serve.status()`, one call at a time in this process.

Ray Serve 2.60's `serve.status()` is not thread-safe: it validates the controller's details with
pydantic, and each deployment's config then re-pickles its request router class and autoscaling
policy "by value", registering their modules with cloudpickle and unregistering them after. That
registry is one set per process: two threads in there at once, and the second unregister raises
`ValueError: <module 'ray.serve.autoscaling_policy'> is not registered for pickle by value`
(seen live in edge-control, whose reads ran in worker threads). A lock makes the calls in this
process take turns; the canary test shows the registration still happens.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.serve.schema import ServeStatus

# Guards cloudpickle's process-wide by-value registry, so it is process-wide too.
_STATUS_LOCK = threading.Lock()


def serve_status() -> ServeStatus:
    """`serve.status()`, never in two threads of this process at once. Blocking."""
    from ray import serve

    with _STATUS_LOCK:
        return serve.status()
