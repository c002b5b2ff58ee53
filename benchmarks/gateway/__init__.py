"""The gateway suite: issue 44's live goals (single flight, fairness between keys, Retry-After
against real readiness, the router's overhead) through the front door of `serve run
serve_config.yaml` (suite.py drives it)."""

from benchmarks.gateway.config import add_arguments
from benchmarks.gateway.suite import NEEDS_RAY, run

__all__ = ["NEEDS_RAY", "add_arguments", "run"]
