"""Where one request's time went inside a model replica: queue wait, batch size, prefill, decode
(or one forward pass). The engine fills it in; the model span and model metrics read it. Plain
Python with an injected clock, so the runtime layer can use it without Ray or OpenTelemetry."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.util.types import AttributeValue

from deployments.observability.attributes import (
    EDGE_MODEL_BATCH_SIZE,
    EDGE_MODEL_DECODE_MS,
    EDGE_MODEL_DECODE_STEPS,
    EDGE_MODEL_FORWARD_MS,
    EDGE_MODEL_PREFILL_MS,
    EDGE_MODEL_QUEUE_WAIT_MS,
    GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
)


@dataclass
class InferenceTimings:
    """Seconds on one clock (perf_counter by default). A request is enqueued when created,
    admitted when its first batch starts; then it runs prefill + decode steps (a chat model) or
    one forward pass (embedding, moderation). Written by the engine thread, read after the last
    result is handed over, so no lock is needed."""

    clock: Callable[[], float] = time.perf_counter
    enqueued_at: float = field(init=False)
    admitted_at: float | None = None
    first_output_at: float | None = None
    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    forward_s: float = 0.0
    max_batch_size: int = 0

    def __post_init__(self) -> None:
        self.enqueued_at = self.clock()

    def admitted(self, at: float | None = None) -> None:
        if self.admitted_at is None:
            self.admitted_at = self.clock() if at is None else at

    def prefilled(self, seconds: float, batch_size: int) -> None:
        """Prefill produces the first token, so it also marks the time to first output. Called
        when it ended: admission, unless marked already, was `seconds` earlier."""
        self.admitted(self.clock() - seconds)
        self.prefill_s += seconds
        self._saw_batch(batch_size)
        if self.first_output_at is None:
            self.first_output_at = self.clock()

    def decoded(self, seconds: float, batch_size: int) -> None:
        """One batched decode step this request took part in (its cost is shared by the batch)."""
        self.decode_s += seconds
        self.decode_steps += 1
        self._saw_batch(batch_size)

    def forwarded(self, started_at: float, seconds: float, batch_size: int) -> None:
        """A whole forward pass that began at `started_at` (same clock) over `batch_size` items."""
        self.admitted(started_at)
        self.forward_s += seconds
        self._saw_batch(batch_size)
        if self.first_output_at is None:
            self.first_output_at = started_at + seconds

    def _saw_batch(self, batch_size: int) -> None:
        self.max_batch_size = max(self.max_batch_size, batch_size)

    @property
    def queue_wait_s(self) -> float | None:
        return None if self.admitted_at is None else max(0.0, self.admitted_at - self.enqueued_at)

    @property
    def time_to_first_output_s(self) -> float | None:
        if self.first_output_at is None:
            return None
        return max(0.0, self.first_output_at - self.enqueued_at)

    @property
    def time_per_output_token_s(self) -> float | None:
        """Decode time per token after the first (prefill makes the first; each step one more)."""
        return self.decode_s / self.decode_steps if self.decode_steps else None

    def attributes(self) -> dict[str, AttributeValue]:
        values = {
            EDGE_MODEL_QUEUE_WAIT_MS: _ms(self.queue_wait_s),
            EDGE_MODEL_BATCH_SIZE: self.max_batch_size or None,
            EDGE_MODEL_PREFILL_MS: _ms(self.prefill_s) if self.prefill_s else None,
            EDGE_MODEL_DECODE_MS: _ms(self.decode_s) if self.decode_steps else None,
            EDGE_MODEL_DECODE_STEPS: self.decode_steps or None,
            EDGE_MODEL_FORWARD_MS: _ms(self.forward_s) if self.forward_s else None,
            GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK: self.time_to_first_output_s,
        }
        return {key: value for key, value in values.items() if value is not None}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)
