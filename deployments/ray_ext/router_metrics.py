"""A Ray Serve 2.60 fix applied in the processes that hold our deployment handles (the router).

Cold-start report at zero replicas. A handle whose deployment has no replica pushes its autoscaling
metrics to the controller the moment a request queues (`RouterMetricsManager.
wrap_queued_request`), so the controller scales up at once. But the report it pushes is the
handle's sampled time series, sampled every `look_back_period_s * 0.2` (at most every
`metrics_interval_s`); the request that just queued is in no sample yet, so the controller reads
zero queued requests and decides only after the next sample *and* the next periodic push: 0.3-0.7 s
measured at load 5 on 2 cores (docs/operating.md, "Cold starts"). Sampling the queue just before
that push makes the report carry the request: the controller decides in its next loop. And the push
is sent even while a periodic one is still unanswered (Serve skips it then, to spare a busy
controller; one report per cold start costs it nothing and the controller keeps the freshest).

No public API serves: when and what a handle reports is inside Serve's private
`RouterMetricsManager`, with no option or hook; so its method is wrapped here, once per process,
and only where it still has the methods and attributes relied on (else nothing is changed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ray.serve")

_PATCHED = "_edge_samples_before_zero_push"


def sample_queue_before_push_at_zero() -> bool:
    """Patch Serve's router metrics manager once per process; False where this Ray Serve lacks
    the methods involved (a newer one may have fixed it: then nothing is changed)."""
    try:
        from ray.serve._private.router import RouterMetricsManager
    except ImportError:
        return False
    manager: Any = RouterMetricsManager
    should_push = getattr(manager, "should_send_scaled_to_zero_optimized_push", None)
    if should_push is None or not hasattr(manager, "_add_autoscaling_metrics_point"):
        log.warning("Ray Serve changed: the cold-start push at zero replicas is left as it is")
        return False
    if getattr(should_push, _PATCHED, False):
        return True
    manager.should_send_scaled_to_zero_optimized_push = _sampling_first(should_push)
    return True


def _sampling_first(should_push: Callable[[Any, int], bool]) -> Callable[[Any, int], bool]:
    """`should_send_scaled_to_zero_optimized_push` that, when it says push, first samples the
    queue into the store the push reads and forgets any push in flight (both its callers push
    right after it says yes)."""

    def should_push_sampled(self: Any, curr_num_replicas: int) -> bool:
        if not should_push(self, curr_num_replicas):
            return False
        self._add_autoscaling_metrics_point()
        self._pending_metrics_push_ref = None
        return True

    setattr(should_push_sampled, _PATCHED, True)
    return should_push_sampled
