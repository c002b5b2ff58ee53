"""Where the chat engine's time goes, summed over its steps (read by the decode benchmarks)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepProfile:
    """Where the engine's time goes, summed over steps: the graph (`session.run`), the rest of a
    step in the engine thread (sampling, detokenising, stop strings, batch bookkeeping), and the
    round trips between the engine thread and the event loop (what is left of `wall_s`)."""

    steps: int = 0
    tokens: int = 0
    graph_s: float = 0.0
    step_s: float = 0.0
    wall_s: float = 0.0
    hops: int = 0

    def per_step_ms(self) -> dict[str, float]:
        steps = max(self.steps, 1)
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "executor_hops": self.hops,
            "graph_ms": round(self.graph_s / steps * 1e3, 3),
            "token_python_ms": round((self.step_s - self.graph_s) / steps * 1e3, 3),
            "hop_ms": round((self.wall_s - self.step_s) / steps * 1e3, 3),
            "wall_ms": round(self.wall_s / steps * 1e3, 3),
        }
