"""The front-door suite (issue 43): the shipped config under mixed load while one process after
another is killed (a router replica, HAProxy, edge-control, Serve's controller, a model replica);
per kill, the requests that failed and how long connections were refused (suite.py drives it)."""

from benchmarks.front_door.config import add_arguments
from benchmarks.front_door.suite import NEEDS_RAY, run

__all__ = ["NEEDS_RAY", "add_arguments", "run"]
