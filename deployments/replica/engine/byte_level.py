"""Byte-level BPE vocabularies (GPT-2's, GLM's, Kimi's): each token id to the bytes it stands for,
so streamed text is cut at whole UTF-8 characters without asking the tokenizer per token."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders


def byte_level_table(tokenizer: Tokenizer) -> list[bytes]:
    """id -> the bytes the token decodes to, for byte-level BPE vocabularies."""
    if not isinstance(tokenizer.decoder, decoders.ByteLevel):
        raise ValueError("only byte-level BPE tokenizers are supported (decoder must be ByteLevel)")
    # In C (str.translate): a Python loop per character took 0.25 s at a 150k vocabulary.
    to_latin1 = str.maketrans({char: chr(byte) for byte, char in _bytes_to_unicode().items()})
    added = tokenizer.get_added_tokens_decoder()
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    table = [b""] * (max(vocab.values(), default=-1) + 1)
    for token, token_id in vocab.items():
        if token_id in added:
            table[token_id] = token.encode("utf-8")
        else:
            table[token_id] = token.translate(to_latin1).encode("latin-1")
    return table


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map that byte-level BPE vocabularies are written in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + shifted)
            shifted += 1
    return mapping
