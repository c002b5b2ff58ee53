"""Kimi-K2's tiktoken tokenizer converted to tokenizer.json: the same ids as tiktoken itself (the
reference Moonshot's tokenizer runs on), Kimi's special-token ids, and a Kimi checkpoint shipping
only tiktoken.model exporting through the real checkpoint path."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import tiktoken
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers.convert_slow_tokenizer import bytes_to_unicode

from deployments.contracts.manifest import ModelManifest
from deployments.export.chat_tokenizer import KIMI_K2_CHAT_TEMPLATE, corpus_lines
from deployments.export.llm import FAMILIES, export_llm
from deployments.export.tiktoken_tokenizer import (
    KIMI_PATTERN,
    RESERVED_SPECIAL_TOKENS,
    kimi_tokenizer,
)
from deployments.replica.engine.tokenizer import ChatTokenizer

# Named specials at their offsets above the ranks, with gaps as in Kimi's own config.
NAMED = {
    0: "[BOS]",
    1: "[EOS]",
    2: "<|im_end|>",
    3: "<|im_user|>",
    4: "<|im_assistant|>",
    10: "<|im_system|>",
    17: "<|im_middle|>",
    255: "[PAD]",
}

TEXTS = [
    "Hello, world! I'll say don't, can't, we're, and they've.",
    "中文English混合 北京市 Pascal 汉字abc",
    "In 2024 there were 123456 events, or 3.14159 pi.",
    "a  b\n\n\nc\t\ttabs   end   ",
    "café naïve résumé Ünïcödé ÀÉÎ",
    "emoji 🚀🔥 and symbols ∑∫√ «quotes» — dashes",
    "def f(x):\n    return x ** 2  # squared\n",
    "<|im_user|>user<|im_middle|>hi<|im_end|>[EOS]",
    "CamelCaseWords UPPER lower MiXeD",
    "",
]


def train_ranks(vocab_size: int = 1200) -> dict[bytes, int]:
    """tiktoken-style ranks from a byte-level BPE trained on the shipped corpus: the 256 bytes,
    then each merge's token in merge order, then a few whole words as traps."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    ranks = {bytes([b]): b for b in range(256)}
    for merge in json.loads(tokenizer.to_str())["model"]["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ")
        token = bytes(byte_of[c] for c in left + right)
        ranks.setdefault(token, len(ranks))
    # Whole words that only a pattern splitting elsewhere than Kimi's would find as one piece
    # (Kimi splits Han from Latin and camel case, and keeps contractions on their word).
    for word in ("中文English混合", "CamelCaseWords", " don", "'t"):
        ranks.setdefault(word.encode(), len(ranks))
    return ranks


@pytest.fixture(scope="module")
def ranks() -> dict[bytes, int]:
    return train_ranks()


def write_kimi_tokenizer(directory: Path, ranks: dict[bytes, int]) -> None:
    """A checkpoint's tokenizer files as Moonshot ships them: no tokenizer.json."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(token).decode()} {rank}" for token, rank in ranks.items()]
    (directory / "tiktoken.model").write_text("\n".join(lines) + "\n")
    base = len(ranks)
    config = {
        "tokenizer_class": "TikTokenTokenizer",
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "added_tokens_decoder": {
            str(base + offset): {"content": name, "special": True} for offset, name in NAMED.items()
        },
        "bos_token": "[BOS]",
        "eos_token": {"content": "[EOS]", "special": True},
        "pad_token": "[PAD]",
        "unk_token": None,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    (directory / "chat_template.jinja").write_text(KIMI_K2_CHAT_TEMPLATE)


def reference_encoding(ranks: dict[bytes, int]) -> tiktoken.Encoding:
    """What Moonshot's TikTokenTokenizer builds from the same files."""
    base = len(ranks)
    specials = {
        NAMED.get(i, f"<|reserved_token_{base + i}|>"): base + i
        for i in range(RESERVED_SPECIAL_TOKENS)
    }
    return tiktoken.Encoding(
        "kimi-test", pat_str=KIMI_PATTERN, mergeable_ranks=ranks, special_tokens=specials
    )


def test_the_conversion_encodes_as_tiktoken_does(ranks, tmp_path):
    write_kimi_tokenizer(tmp_path, ranks)
    converted = kimi_tokenizer(str(tmp_path))
    reference = reference_encoding(ranks)
    texts = [*TEXTS, *list(corpus_lines())[::40]]
    for text in texts:
        expected = reference.encode(text, allowed_special="all")
        assert converted.encode(text, add_special_tokens=False) == expected, text
        assert converted.decode(expected) == text


def test_special_tokens_keep_their_kimi_ids_and_names(ranks, tmp_path):
    write_kimi_tokenizer(tmp_path, ranks)
    converted = kimi_tokenizer(str(tmp_path))
    base = len(ranks)
    assert len(converted) == base + RESERVED_SPECIAL_TOKENS
    for offset, name in NAMED.items():
        assert converted.convert_tokens_to_ids(name) == base + offset
    assert converted.convert_tokens_to_ids(f"<|reserved_token_{base + 5}|>") == base + 5
    assert (converted.bos_token, converted.eos_token, converted.pad_token) == (
        "[BOS]",
        "[EOS]",
        "[PAD]",
    )
    prompt = converted.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.startswith("<|im_system|>system<|im_middle|>")
    assert prompt.endswith(
        "<|im_user|>user<|im_middle|>hi<|im_end|><|im_assistant|>assistant<|im_middle|>"
    )


def test_a_kimi_checkpoint_with_only_tiktoken_exports_and_serves(ranks, tmp_path):
    checkpoint = tmp_path / "Kimi-K2-tiny"
    write_kimi_tokenizer(checkpoint, ranks)
    base = len(ranks)
    config = FAMILIES["kimi"].tiny_config(base + RESERVED_SPECIAL_TOKENS, base + 255)
    config.eos_token_id = base + 2  # <|im_end|>, as Kimi-K2-Instruct's generation config says
    torch.manual_seed(0)
    FAMILIES["kimi"].model_class(config).save_pretrained(checkpoint)

    manifest = export_llm("kimi", str(checkpoint), tmp_path / "out")

    assert manifest.llm is not None
    assert manifest.llm.eos_token_ids == [base + 2]
    assert manifest.llm.special_tokens["<|im_middle|>"] == base + 17
    served = ChatTokenizer.from_manifest(tmp_path / "out", ModelManifest.load(tmp_path / "out"))
    ids = served.encode_chat([{"role": "user", "content": "中文English混合"}])
    reference = reference_encoding(ranks)
    assert ids == reference.encode(
        served.render([{"role": "user", "content": "中文English混合"}]), allowed_special="all"
    )
    assert served.decode(ids, skip_special_tokens=False).endswith(
        "<|im_assistant|>assistant<|im_middle|>"
    )
