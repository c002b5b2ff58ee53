"""The router_cpu suite: the router's CPU per request, in process and in its replicas."""

from benchmarks.router_cpu.suite import NEEDS_RAY, add_arguments, run

__all__ = ["NEEDS_RAY", "add_arguments", "run"]
