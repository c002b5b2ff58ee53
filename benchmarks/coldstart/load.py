"""Each model's runtime constructed in this process, a few times: graph load, warm-up and the
constructor's wall time, the part of a cold start a replica cannot avoid."""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from deployments.replica.engine.embedding import EmbeddingRuntime
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.moderation import ModerationRuntime
from deployments.replica.engine.session import SessionConfig

log = logging.getLogger(__name__)

Clock = Callable[[], float]


def _median(samples: list[float]) -> float:
    return round(float(statistics.median(samples)), 4)


def load_times(
    models_dir: Path,
    tasks: Mapping[str, str],
    threads: int,
    repetitions: int,
    clock: Clock = time.perf_counter,
) -> dict[str, Any]:
    """`tasks`: model name -> task (chat, embedding, moderation), each loaded from
    `models_dir / name` on the CPU with `threads` intra-op threads."""
    session = SessionConfig(provider="cpu", intra_op_threads=threads)
    factories: dict[str, Callable[[Path], Any]] = {
        "chat": lambda path: LLMRuntime(path, session),
        "embedding": lambda path: EmbeddingRuntime(path, session),
        # Its graph's ops are CPU-only, so the runtime itself never puts it on a GPU.
        "moderation": lambda path: ModerationRuntime(path, session),
    }
    results: dict[str, Any] = {}
    for name, task in tasks.items():
        runs: list[tuple[float, float, float]] = []
        for _ in range(repetitions):
            start = clock()
            runtime = factories[task](models_dir / name)
            wall = clock() - start
            runs.append((runtime.session.load_s, runtime.session.warmup_s, wall))
            if isinstance(runtime, LLMRuntime):
                runtime.close()
        load_s, warmup_s, wall_s = (list(column) for column in zip(*runs, strict=True))
        results[name] = {
            "load_s": _median(load_s),
            "warmup_s": _median(warmup_s),
            "total_wall_s": _median(wall_s),
            "first_total_wall_s": round(wall_s[0], 4),
        }
        log.info("load %s: %s", name, results[name])
    return results
