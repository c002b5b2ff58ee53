"""The cold-start suite: zero-to-first-response per model split into phases, upscale reaction,
keep-warm windows, replica import costs (suite.py drives the rest of the package)."""

from benchmarks.coldstart.config import add_arguments
from benchmarks.coldstart.suite import NEEDS_RAY, run

__all__ = ["NEEDS_RAY", "add_arguments", "run"]
