"""The wide byte-level tokenizers of the at-size stand-ins: exactly the real vocabulary size, the
chat format's specials at their ids, any text round-trips, the synthetic merges fire."""

from __future__ import annotations

import pytest

from deployments.export.chat_tokenizer import CHAT_FORMATS
from deployments.export.llm_families import AT_SIZE_VOCAB
from deployments.export.wide_tokenizer import build_wide_tokenizer


@pytest.fixture(scope="module")
def glm_tokenizer():
    return build_wide_tokenizer(CHAT_FORMATS["glm"], AT_SIZE_VOCAB["glm"])


def test_the_vocabulary_has_the_real_size_with_every_id_used(glm_tokenizer):
    vocab = glm_tokenizer.get_vocab(with_added_tokens=True)
    assert glm_tokenizer.get_vocab_size(with_added_tokens=True) == 151_552
    assert sorted(vocab.values()) == list(range(151_552))
    for token_id, token in enumerate(CHAT_FORMATS["glm"].special_tokens):
        assert vocab[token] == token_id


def test_any_text_round_trips(glm_tokenizer):
    text = "def f(x):\n    return x  # 你好, ÿ \U0001f600<|user|>"
    assert glm_tokenizer.decode(glm_tokenizer.encode(text).ids, skip_special_tokens=False) == text


def test_a_synthetic_merge_is_produced_from_its_text(glm_tokenizer):
    vocab = glm_tokenizer.get_vocab()
    # A late id joining two word pieces with no space between them: one pre-token, so BPE can
    # reach it by its merge (it comes after the trained merges, so it must not be in their way).
    late = [t for t, i in vocab.items() if i > 100_000 and t.isalpha() and t.isascii()]
    assert late
    token = min(late, key=lambda t: vocab[t])
    assert glm_tokenizer.encode(token).ids == [vocab[token]]


def test_kimi_gets_its_own_size():
    tokenizer = build_wide_tokenizer(CHAT_FORMATS["kimi"], AT_SIZE_VOCAB["kimi"])
    assert tokenizer.get_vocab_size(with_added_tokens=True) == 163_840
