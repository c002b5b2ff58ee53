"""Whether an exported sentence encoder says what the PyTorch checkpoint says: both embed the same
parity set in padded batches (so pooling must ignore padding), and the vectors must agree within
the bars of their export (fp32 plain or fused, int8)."""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from deployments.export.common import VerificationError, max_abs_diff
from deployments.replica.engine.embedding import OUTPUT_NAME, SentenceTokenizer, TokenBatch
from deployments.replica.engine.session import SessionConfig, open_session

# Parity bars for `verify=True`. fp32 differs from PyTorch only by kernel rounding; int8 moves every
# vector a little, so its bar is on direction only (one-word inputs are its worst case, ~0.99).
FP32_MIN_COSINE = 0.9999
FP32_ATOL = 1e-4
FUSED_MIN_COSINE = 0.999  # the bar for the fused graph; measured: 0.99999+ (same as plain)
INT8_MIN_COSINE = 0.98
PARITY_CORPUS_LINES = 60  # of corpus/english.txt, added to VERIFY_SENTENCES: the parity set

# Lengths differ on purpose: the batch is padded, so pooling has to ignore [PAD] positions.
VERIFY_SENTENCES = (
    "A man is playing a guitar.",
    "Ray Serve scales replicas from zero when the first request arrives at an edge location.",
    "hi",
    "The quick brown fox jumps over the lazy dog, then naps in the afternoon sun.",
)


def parity_sentences() -> tuple[str, ...]:
    """The parity set: the hand-picked edge cases and real sentences of varied length."""
    text = (importlib.resources.files("deployments.export.corpus") / "english.txt").read_text(
        encoding="utf-8"
    )
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return VERIFY_SENTENCES + tuple(lines[:PARITY_CORPUS_LINES])


@dataclass(frozen=True)
class EmbeddingParity:
    """How far the ONNX vectors are from PyTorch's on the same tokens."""

    max_abs_diff: float
    min_cosine: float
    sentences: int


def reference_embeddings(encoder: torch.nn.Module, batch: TokenBatch) -> np.ndarray:
    """PyTorch's vectors, pooled in NumPy, so the in-graph pooling is checked, not just replayed."""
    with torch.inference_mode():
        hidden = encoder(
            input_ids=torch.from_numpy(batch.input_ids),
            attention_mask=torch.from_numpy(batch.attention_mask),
        ).last_hidden_state.numpy()
    mask = batch.attention_mask[..., None].astype(np.float64)
    mean = (hidden.astype(np.float64) * mask).sum(axis=1) / mask.sum(axis=1)
    return mean / np.linalg.norm(mean, axis=1, keepdims=True)


def check_parity(
    graph: Path,
    tokenizer: SentenceTokenizer,
    encoder: torch.nn.Module,
    *,
    min_cosine: float,
    atol: float | None,
    sentences: tuple[str, ...] | None = None,
    batch_size: int = 32,
) -> EmbeddingParity:
    """Embed `sentences` (default: the parity set) in padded batches both ways, so padding and
    several batch shapes are covered; raise VerificationError past the bars."""
    texts = parity_sentences() if sentences is None else sentences
    session = open_session(graph, SessionConfig(provider="cpu"))
    actual_parts, expected_parts = [], []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer.batch(texts[start : start + batch_size])
        actual_parts.append(session.run(batch.feeds(session.input_names))[OUTPUT_NAME])
        expected_parts.append(reference_embeddings(encoder, batch))
    actual, expected = np.concatenate(actual_parts), np.concatenate(expected_parts)
    if actual.shape != expected.shape:
        raise VerificationError(f"embeddings: shape {actual.shape} != expected {expected.shape}")
    cosines = (actual.astype(np.float64) * expected).sum(axis=1) / np.linalg.norm(actual, axis=1)
    parity = EmbeddingParity(
        max_abs_diff=max_abs_diff(actual, expected),
        min_cosine=float(cosines.min()),
        sentences=len(texts),
    )
    if not parity.min_cosine > min_cosine:  # `not >` also catches NaN
        raise VerificationError(f"embeddings: min cosine {parity.min_cosine:.6f} <= {min_cosine}")
    if atol is not None and not parity.max_abs_diff <= atol:
        raise VerificationError(
            f"embeddings: max abs diff {parity.max_abs_diff:.3g} exceeds tolerance {atol:g}"
        )
    return parity
