"""The chat suite: served time to first token and concurrent throughput, with `generate()` per
request as the peer baseline."""

from benchmarks.chat.suite import NEEDS_RAY, run

__all__ = ["NEEDS_RAY", "run"]
