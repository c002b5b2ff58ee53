"""The router suite: our router's latency next to pass-throughs and the model as its own ingress."""

from benchmarks.router.suite import NEEDS_RAY, run

__all__ = ["NEEDS_RAY", "run"]
