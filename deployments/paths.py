"""Where the project's own files are: the checkout's root, which configs and generated files are
relative to. A leaf module (it imports nothing of ours), so any layer may use it."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
