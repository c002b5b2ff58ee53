"""What the suites send: one chat prompt and real English sentences of varied length."""

from __future__ import annotations

import importlib.resources
from typing import Any

CHAT_PROMPT: tuple[dict[str, Any], ...] = (
    {"role": "user", "content": "Tell me a short story about a train that runs late."},
)
SENTENCE_CORPUS = ("deployments.export.corpus", "english.txt")


def chat_messages() -> list[dict[str, Any]]:
    return [dict(message) for message in CHAT_PROMPT]


def benchmark_sentences(count: int) -> list[str]:
    """`count` real English sentences of varied length (repeated if the corpus is shorter)."""
    package, name = SENTENCE_CORPUS
    text = (importlib.resources.files(package) / name).read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return [lines[i % len(lines)] for i in range(count)]
