"""The embedded chat defaults' recipe revision, named in their manifest's `source`: bumped whenever
their weights or graph change, so `make models` rebuilds a directory an older exporter built (its
files still match its own manifest)."""

from __future__ import annotations

from typing import Final

# 2: Kimi-K2's cache widths and the absorbed attention (2026-12-03).
# 3: Kimi-K2's tool-call markers are special tokens, as in its real vocabulary.
# 4: Kimi-K2's routed experts as ONNX Runtime's MoE op (fused_moe.py).
CHAT_DEFAULT_REVISION: Final = "revision 4"
