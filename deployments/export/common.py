"""What every exporter shares: a clean output directory and loud parity checks."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np


class VerificationError(RuntimeError):
    """`--verify` found the ONNX graph too far from the source model."""


def fresh_dir(out: str | Path) -> Path:
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    return out


def max_abs_diff(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.max(np.abs(actual.astype(np.float64) - expected.astype(np.float64))))


def check_close(what: str, actual: np.ndarray, expected: np.ndarray, atol: float) -> float:
    """Return the max abs difference, raising VerificationError past `atol`."""
    if actual.shape != expected.shape:
        raise VerificationError(f"{what}: shape {actual.shape} != expected {expected.shape}")
    diff = max_abs_diff(actual, expected)
    if not diff <= atol:  # also catches NaN
        raise VerificationError(f"{what}: max abs diff {diff:.3g} exceeds tolerance {atol:g}")
    return diff
