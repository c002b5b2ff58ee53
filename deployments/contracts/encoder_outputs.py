"""What the encoder models return: embedding vectors and moderation verdicts.

Apart from their runtimes (tokenizers, ONNX Runtime) so the router, which reads these answers,
does not load what computes them; the chat model's answers are in `deployments.contracts.outputs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)  # eq on arrays is ambiguous; compare `vectors` explicitly
class EmbeddingResult:
    """One unit-length float32 row per text, and each text's tokens (counting [CLS] and [SEP])."""

    vectors: np.ndarray
    token_counts: list[int]

    @property
    def total_tokens(self) -> int:
        return sum(self.token_counts)

    def rows(self, start: int, stop: int) -> EmbeddingResult:
        """Texts `start` to `stop` of this result: one request's share of a merged batch (a view,
        no copy)."""
        return EmbeddingResult(self.vectors[start:stop], self.token_counts[start:stop])

    def split(self) -> list[EmbeddingResult]:
        """One single-row result per text, so a batch merged from requests can be handed back."""
        return [
            EmbeddingResult(vectors=self.vectors[row : row + 1], token_counts=[count])
            for row, count in enumerate(self.token_counts)
        ]

    @classmethod
    def concat(cls, parts: Sequence[EmbeddingResult]) -> EmbeddingResult:
        if not parts:
            raise ValueError("nothing to concatenate")
        return cls(
            vectors=np.concatenate([part.vectors for part in parts]),
            token_counts=[count for part in parts for count in part.token_counts],
        )


@dataclass(frozen=True)
class ModerationResult:
    """One input's verdict, shaped like an OpenAI moderation result."""

    flagged: bool
    categories: dict[str, bool]
    category_scores: dict[str, float]
