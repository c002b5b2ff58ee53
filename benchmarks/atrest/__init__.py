"""The at-rest suite: the CPU of the whole cluster `serve run serve_config.yaml` runs with every
model at zero, next to Ray Serve's hello world run the same way, then the embedding model's cold
starts from zero through its HTTP port, a cycle every ~10 s (suite.py drives it)."""

from benchmarks.atrest.config import add_arguments
from benchmarks.atrest.suite import NEEDS_RAY, run

__all__ = ["NEEDS_RAY", "add_arguments", "run"]
