"""The embeddings suite: served embeddings throughput, batching's speed-up, and the docs-pattern
PyTorch deployment as the peer baseline."""

from benchmarks.embeddings.suite import NEEDS_RAY, run

__all__ = ["NEEDS_RAY", "run"]
