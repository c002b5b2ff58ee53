"""The chat suite: served time to first token and concurrent throughput, with `generate()` per
request and vLLM's OpenAI server (`--vllm-python`) as the peers."""

from benchmarks.chat.suite import NEEDS_RAY, add_arguments, run

__all__ = ["NEEDS_RAY", "add_arguments", "run"]
