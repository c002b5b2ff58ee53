"""The at-size suite: the GLM-4 and Kimi-K2 stand-ins at size served as the README serves them,
against vLLM's OpenAI server on the same checkpoints, with the compute roof, int8's greedy
agreement and decode stalls while a long prompt is prefilled."""

from benchmarks.at_size.suite import NEEDS_RAY, add_arguments, run

__all__ = ["NEEDS_RAY", "add_arguments", "run"]
