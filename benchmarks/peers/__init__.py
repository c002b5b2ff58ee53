"""Peer baselines (issue 14): our app against what a user would deploy instead, in one cluster."""

from benchmarks.peers.suite import add_arguments, run

__all__ = ["add_arguments", "run"]
