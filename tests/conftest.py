"""Shared fixtures: where the embedded default models live (built on demand)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def models_root() -> Path:
    """The default models built by `make models` (or EDGE_MODELS_DIR); built here if missing."""
    root = Path(os.environ.get("EDGE_MODELS_DIR", REPO / "models"))
    from deployments.export.defaults import DEFAULT_MODELS, build_defaults

    missing = [name for name in DEFAULT_MODELS if not (root / name / "manifest.json").is_file()]
    if missing:
        build_defaults(root, only=missing)
    return root
