"""A model opened as a chat replica opens it, in a process of its own that imports what a replica
imports and nothing of the suites (the at-size suite's package pulls in Ray: a few hundred MB that
a replica's memory would be charged with): `python -m benchmarks.lib.replica_process DIR THREADS`
answers one request, prints READY and waits until its stdin closes."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from benchmarks.lib.corpus import chat_messages

READY = "ready"
ANSWER_TOKENS = 4


def serve_one(model_dir: Path, threads: int) -> None:
    """The runtime opened on the CPU at `threads`, one answer, then idle until stdin closes."""
    from deployments.contracts.sampling_params import SamplingParams
    from deployments.contracts.session_config import SessionConfig
    from deployments.replica.engine.llm import LLMRuntime

    config = SessionConfig(provider="cpu", intra_op_threads=threads, inter_op_threads=1)
    runtime = LLMRuntime(model_dir, config)
    params = SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS)
    asyncio.run(runtime.complete(chat_messages(), params))
    print(READY, flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    serve_one(Path(sys.argv[1]), int(sys.argv[2]))
