"""Kimi-K2 checkpoints ship a tiktoken tokenizer (`tiktoken.model` and Moonshot's remote-code
`tokenization_kimi.py`), not the `tokenizer.json` our runtime serves. This converts one as
Moonshot's class defines it: the same BPE ranks, its Han-aware pre-tokenization pattern, and the
256 special tokens above the ranks (named in `tokenizer_config.json`, `<|reserved_token_N|>`
otherwise), so the ids match what the model was trained on.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter
from transformers.utils import cached_file

TIKTOKEN_FILE = "tiktoken.model"

# `TikTokenTokenizer.pat_str` of moonshotai/Kimi-K2-Instruct: GPT-4o's pattern with Han runs
# split off first (`&&[^\p{Han}]` keeps them out of the letter runs).
KIMI_PATTERN = "|".join(
    [
        r"[\p{Han}]+",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
        r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)
RESERVED_SPECIAL_TOKENS = 256  # `TikTokenTokenizer.num_reserved_special_tokens`


def has_tiktoken_tokenizer(source: str) -> bool:
    """Does the checkpoint (a local directory or a hub id) ship `tiktoken.model`?"""
    return _checkpoint_file(source, TIKTOKEN_FILE) is not None


def kimi_tokenizer(source: str) -> PreTrainedTokenizerFast:
    """The checkpoint's tiktoken tokenizer as a fast tokenizer with its chat template."""
    ranks_file = _checkpoint_file(source, TIKTOKEN_FILE)
    config_file = _checkpoint_file(source, "tokenizer_config.json")
    if ranks_file is None or config_file is None:
        raise ValueError(f"{source}: a tiktoken tokenizer needs {TIKTOKEN_FILE} and its config")
    config = json.loads(Path(config_file).read_text(encoding="utf-8"))
    ranks = read_ranks(ranks_file)
    base_vocab_size = len(ranks)
    if set(ranks.values()) != set(range(base_vocab_size)):
        # The specials' ids follow the ranks: a gap would shift every one of them.
        raise ValueError(f"{ranks_file}: ranks are not 0..{base_vocab_size - 1} without gaps")
    named = {int(i): t["content"] for i, t in config.get("added_tokens_decoder", {}).items()}
    specials = [
        named.get(i, f"<|reserved_token_{i}|>")
        for i in range(base_vocab_size, base_vocab_size + RESERVED_SPECIAL_TOKENS)
    ]
    converted: Tokenizer = _Converter(
        ranks, pattern=KIMI_PATTERN, extra_special_tokens=specials
    ).converted()
    template_file = _checkpoint_file(source, "chat_template.jinja")
    template = (
        Path(template_file).read_text(encoding="utf-8") if template_file else None
    ) or config.get("chat_template")
    return PreTrainedTokenizerFast(
        tokenizer_object=converted,
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
        pad_token=_token_text(config.get("pad_token")),
        unk_token=_token_text(config.get("unk_token")),
        chat_template=template,
        clean_up_tokenization_spaces=False,
    )


def read_ranks(path: str | Path) -> dict[bytes, int]:
    """A tiktoken BPE file: one `base64(token) rank` per line."""
    ranks = {}
    for line in Path(path).read_bytes().splitlines():
        if line.strip():
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


class _Converter(TikTokenConverter):
    """transformers' converter over ranks already read: tiktoken's own loader would read the
    file a second time, needs tiktoken, and caches files by path (a tokenizer rewritten in place
    would come back stale)."""

    def __init__(self, ranks: dict[bytes, int], **kwargs: Any):
        super().__init__(vocab_file=None, **kwargs)
        self._ranks = ranks

    def load_tiktoken_bpe(self, tiktoken_url: str) -> dict[bytes, int]:  # type: ignore[override]
        return self._ranks


def _token_text(token: str | dict | None) -> str | None:
    """tokenizer_config.json spells a token as its text or as a serialised AddedToken."""
    return token.get("content") if isinstance(token, dict) else token


def _checkpoint_file(source: str, name: str) -> str | None:
    return cached_file(
        source,
        name,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )
