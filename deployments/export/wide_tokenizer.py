"""A byte-level BPE tokenizer of a real model's vocabulary size (GLM-4: 151,552; Kimi-K2: 163,840)
built here without a download: the shipped corpus's own merges, then deterministic synthetic
merges until the vocabulary has exactly the size asked for.

The shipped corpus (88 KB) yields a few thousand merges; a vocabulary of 150k needs as many merges
as real pre-training text gives. Each synthetic merge joins two tokens already in the vocabulary
(frequent ones first), so it is a valid BPE merge that decodes to its bytes; one that spans a
pre-tokenizer boundary (a word and the next word's leading space) is never produced, as real
vocabularies also hold ids that text rarely reaches. What matters at this size is the width the
engine runs at (the head, sampling, logprobs and grammar masks over 150k candidates), not which
strings the ids stand for.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

from tokenizers import Tokenizer

from deployments.export.chat_tokenizer import ChatFormat, build_tokenizer

# Trained merges first: as many as the corpus supports (BpeTrainer stops when no pair repeats).
TRAINED_VOCAB = 8192


def build_wide_tokenizer(fmt: ChatFormat, vocab_size: int) -> Tokenizer:
    """`fmt`'s tokenizer trained on the shipped corpus, widened to exactly `vocab_size` ids."""
    tokenizer = build_tokenizer(fmt, min(TRAINED_VOCAB, vocab_size))
    have = tokenizer.get_vocab_size(with_added_tokens=True)
    if have >= vocab_size:
        return tokenizer
    spec = json.loads(tokenizer.to_str())
    model = spec["model"]
    vocab: dict[str, int] = model["vocab"]
    merges: list[list[str]] = [_pair(m) for m in model["merges"]]
    next_id = have  # the trained ids (specials included) are 0..have-1
    for left, right in _synthetic_pairs(_by_id(vocab), vocab):
        if next_id == vocab_size:
            break
        vocab[left + right] = next_id
        merges.append([left, right])
        next_id += 1
    model["merges"] = merges
    wide = Tokenizer.from_str(json.dumps(spec))
    got = wide.get_vocab_size(with_added_tokens=True)
    if got != vocab_size:
        raise RuntimeError(f"{fmt.family}: widened tokenizer has {got} ids, not {vocab_size}")
    return wide


def _pair(merge: str | list[str]) -> list[str]:
    # tokenizers writes merges as [left, right]; older files as "left right".
    return list(merge) if not isinstance(merge, str) else merge.split(" ", 1)


def _by_id(vocab: dict[str, int]) -> list[str]:
    return [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]


def _synthetic_pairs(base: list[str], vocab: dict[str, int]) -> Iterator[tuple[str, str]]:
    """(left, right) pairs whose join is not yet a token, in a fixed order: the trained tokens
    (lower ids were merged earlier, so they are the more frequent) joined with each other, the
    lowest sum of ranks first, so the earliest synthetic tokens are plausible strings."""
    trained = base[256:]  # after the byte alphabet, the corpus's merges in the order learnt
    for total in range(2 * len(trained) - 1):
        for i in range(max(0, total - len(trained) + 1), min(total, len(trained) - 1) + 1):
            left, right = trained[i], trained[total - i]
            if left + right not in vocab:
                yield left, right
