"""Per-request outcomes folded into counters and a log-spaced latency histogram as they happen,
so ten million requests cost a few kilobytes, not ten million records."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

BINS_PER_DECADE = 50  # bin edges 4.7% apart: a percentile read from bins is within ~2.3%
MIN_MS = 0.01
N_BINS = BINS_PER_DECADE * 8  # 0.01 ms .. 1000 s
_LOG_MIN = math.log10(MIN_MS)


def bins_of(latency_ms: np.ndarray) -> np.ndarray:
    """The histogram bin of each latency (a chunk's requests at once)."""
    logs = np.log10(np.maximum(latency_ms, MIN_MS))
    return np.minimum(((logs - _LOG_MIN) * BINS_PER_DECADE).astype(np.int64), N_BINS - 1)


def bin_middle_ms(index: np.ndarray) -> np.ndarray:
    """The geometric middle of each bin."""
    return 10 ** (_LOG_MIN + (index + 0.5) / BINS_PER_DECADE)


def percentile_ms(histogram: Iterable[int] | np.ndarray, q: float) -> float | None:
    """The q-th percentile (0-100) of a histogram, None when it is empty."""
    counts = np.asarray(histogram, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return None
    rank = max(1, math.ceil(q / 100.0 * total))
    index = int(np.searchsorted(np.cumsum(counts), rank))
    return float(bin_middle_ms(np.array(index)))
