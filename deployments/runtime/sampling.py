"""Choosing the next token (greedy, temperature, nucleus) and where generated text must stop."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from deployments.errors import InvalidRequestError

MAX_STOP_STRINGS = 4
GREEDY_BELOW_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise InvalidRequestError(
                f"max_tokens must be at least 1, got {self.max_tokens}", param="max_tokens"
            )
        if not 0.0 <= self.temperature <= 2.0:
            raise InvalidRequestError(
                f"temperature must be between 0 and 2, got {self.temperature}", param="temperature"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}", param="top_p")
        if len(self.stop) > MAX_STOP_STRINGS or any(not s for s in self.stop):
            raise InvalidRequestError(
                f"stop takes up to {MAX_STOP_STRINGS} non-empty strings", param="stop"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW_TEMPERATURE


def sample_token(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    if params.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        keep = order[: int(np.searchsorted(cumulative, params.top_p)) + 1]
        return int(keep[_draw(probs[keep], rng)])
    return _draw(probs, rng)


def _draw(weights: np.ndarray, rng: np.random.Generator) -> int:
    # Inverse-CDF sampling: one uniform draw, half the cost of rng.choice(p=...) per token.
    cdf = np.cumsum(weights)
    return min(int(cdf.searchsorted(rng.random() * cdf[-1], side="right")), len(cdf) - 1)


class StopStringMatcher:
    """Finds the first stop string in growing text and says how much text is safe to emit:
    a tail that could still become a stop string is held back until it can't."""

    def __init__(self, stops: Sequence[str]):
        self.stops = tuple(stops)
        self._longest = max((len(s) for s in self.stops), default=0)

    def find(self, text: str, start: int = 0) -> int | None:
        """Index of the earliest stop string at or after `start` (minus overlap), else None."""
        from_ = max(0, start - self._longest + 1)
        hits = [i for i in (text.find(s, from_) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        for keep in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-keep:]
            if any(s.startswith(tail) for s in self.stops):
                return len(text) - keep
        return len(text)
