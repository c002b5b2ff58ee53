"""Ray Serve's own request-based autoscaling, on the requests the replicas hold: a router that
coalesces concurrent embedding or moderation requests sends one call for many
(deployments.ingress.edge.coalesce), so the calls in flight that Serve counts understate the load.
Each text replica reports the requests it holds (Serve's custom autoscaling metrics:
`record_autoscaling_stats`, under REQUESTS_METRIC); this policy runs Serve's default policy on
that count, plus the calls still queued at handles, wherever it is the larger.

Used from a deployment's `autoscaling_config` in serve_config.yaml:

    policy: {policy_function: deployments.control.autoscale:ByHeldRequests}

Ray Serve pickles this module by value into its controller, which cannot import the project:
keep it to the standard library and Ray. And never raise there (see deployments.control.keep_warm):
a failure is logged and that tick scales by Serve's own count.
"""

from __future__ import annotations

import inspect
import logging
from typing import TYPE_CHECKING, Any

# A str imported by name: pickled by value with this module, so the controller needs no import
from deployments.contracts.autoscaling import REQUESTS_METRIC

if TYPE_CHECKING:
    from ray.serve.config import AutoscalingContext

HELD_REQUESTS_POLICY = "deployments.control.autoscale:ByHeldRequests"  # the `policy_function`
logger = logging.getLogger("ray.serve")  # Serve's logger: lands in the controller's log


class ByHeldRequests:
    """Ray Serve instantiates this once per deployment, then calls it on every autoscaling tick;
    it returns (desired replicas, policy state), as Serve's default policy does."""

    def __init__(self, **policy_kwargs: Any) -> None:
        # Imported here so that checking a config does not load Ray Serve.
        from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy

        self._by_requests = replica_queue_length_autoscaling_policy

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
        try:
            load = held_requests(ctx) + float(ctx.total_queued_requests or 0)
            if load > ctx.total_num_requests:
                ctx = with_total_requests(ctx, load)
        except Exception:  # noqa: BLE001 - see the module docstring: never raise in the controller
            logger.exception("held-requests autoscaling failed; scaling by calls this tick")
        return self._by_requests(ctx)


def held_requests(ctx: AutoscalingContext) -> float:
    """The requests every running replica reported holding (each averaged over Serve's look-back
    window); 0 before any replica reported."""
    per_replica = (ctx.aggregated_metrics or {}).get(REQUESTS_METRIC) or {}
    return float(sum(per_replica.values()))


def with_total_requests(ctx: AutoscalingContext, total: float) -> AutoscalingContext:
    """The same context but for its request count: every argument of Serve's public constructor
    is read back from the attribute of the same name."""
    cls = type(ctx)
    names = [name for name in inspect.signature(cls).parameters if name != "total_num_requests"]
    return cls(total_num_requests=total, **{name: getattr(ctx, name) for name in names})
