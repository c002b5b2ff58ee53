"""Recent prompts' KV caches, reused by a new prompt that starts the same way (vLLM's automatic
prefix caching, in its simplest form).

A causal decoder's cache for the first L positions depends on those L tokens alone, so a prompt
that shares its first L tokens with a cached one needs only the rest prefilled. What prompts
share: a chat template's system prompt (Kimi's default one is 29 of the benchmark prompt's 47
tokens), an application's own system prompt, and every earlier turn of a conversation.

Prompts are indexed by a chain of hashes over blocks of BLOCK_TOKENS tokens (each block's hash
covers everything before it), so a lookup costs one pass over the prompt; the tokens themselves
are compared before a match is used. Least recently used prompts are dropped beyond `max_bytes`
of cached tensors, and beyond the room a KV budget leaves it (`fit_within`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from deployments.replica.engine.decoder import KVCache

BLOCK_TOKENS = 16
# Bytes, not positions: a position is 4.6 KB for the Kimi stand-in's latent, 1 KB for the GLM
# stand-in, about 80 KB for a real GLM-4-9B in float32. 64 MiB holds about 14,000 positions of the
# Kimi stand-in, or about 800 (a few system prompts) of a real 9B model.
DEFAULT_MAX_BYTES = 64 << 20


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    cache: KVCache
    hashes: list[int]
    nbytes: int


@dataclass(frozen=True)
class PrefixHit:
    """The first `length` positions of a new prompt, already computed."""

    length: int
    cache: KVCache


class PrefixCache:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes < 0:
            raise ValueError("max_bytes must be 0 (off) or more")
        self.max_bytes = max_bytes
        self.room_bytes: int | None = None  # what the replica's KV budget leaves it; None: all
        # The engine thread matches and stores; a live config change resizes from the event loop.
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[int, ...], _Entry] = OrderedDict()
        self._by_hash: dict[int, _Entry] = {}
        self.tokens = 0  # cached positions, summed over entries
        self.nbytes = 0
        self.hits = 0
        self.reused_tokens = 0

    @property
    def enabled(self) -> bool:
        return self.max_bytes > 0

    def match(self, prompt: Sequence[int]) -> PrefixHit | None:
        """The longest cached prefix of `prompt`, at least one block long and leaving at least
        its last token to prefill (the step needs that token's logits); None if there is none."""
        with self._lock:
            return self._match(prompt)

    def _match(self, prompt: Sequence[int]) -> PrefixHit | None:
        if not self.enabled:
            return None
        found: _Entry | None = None
        blocks = 0
        for count, digest in enumerate(_block_hashes(prompt), start=1):
            entry = self._by_hash.get(digest)
            if entry is None:
                break
            found, blocks = entry, count
        if found is None:
            return None
        usable = min(len(found.tokens), len(prompt) - 1)
        length = 0
        while length < usable and found.tokens[length] == prompt[length]:
            length += 1
        if length < min(blocks * BLOCK_TOKENS, usable):  # a hash collision: blocks differ
            return None
        self._entries.move_to_end(found.tokens)
        self.hits += 1
        self.reused_tokens += length
        return PrefixHit(length, _head(found.cache, length))

    def store(self, prompt: Sequence[int], cache: KVCache) -> None:
        """Keep `cache` (exactly `prompt`'s positions) for prompts that start the same way."""
        with self._lock:
            self._store(prompt, cache)

    def _store(self, prompt: Sequence[int], cache: KVCache) -> None:
        tokens = tuple(prompt)
        if cache.length != len(tokens):
            raise ValueError(f"a cache of {cache.length} positions for {len(tokens)} tokens")
        if tokens in self._entries:  # the same prompt again: the same positions, kept as they are
            self._entries.move_to_end(tokens)
            return
        nbytes = sum(key.nbytes + value.nbytes for key, value in cache.layers)
        if not self.enabled or len(tokens) < BLOCK_TOKENS or nbytes > self._bound:
            return
        entry = _Entry(tokens, _own(cache), list(_block_hashes(tokens)), nbytes)
        self._entries[tokens] = entry
        self.tokens += len(tokens)
        self.nbytes += nbytes
        for digest in entry.hashes:
            self._by_hash[digest] = entry  # the newest prompt with this prefix answers for it
        self._evict()

    def resize(self, max_bytes: int) -> None:
        """A new bound (a live config change): least recently used prompts go until it holds;
        0 empties the cache and turns it off."""
        if max_bytes < 0:
            raise ValueError("max_bytes must be 0 (off) or more")
        with self._lock:
            self.max_bytes = max_bytes
            self._evict()

    def fit_within(self, room_bytes: int) -> None:
        """What a KV budget leaves the cache after the running sequences: least recently used
        prompts go until it holds (the running sequences come first)."""
        with self._lock:
            self.room_bytes = max(0, room_bytes)
            self._evict()

    @property
    def _bound(self) -> int:
        return self.max_bytes if self.room_bytes is None else min(self.max_bytes, self.room_bytes)

    def _evict(self) -> None:
        while self.nbytes > self._bound:
            _, oldest = self._entries.popitem(last=False)
            self._forget(oldest)

    def _forget(self, entry: _Entry) -> None:
        self.tokens -= len(entry.tokens)
        self.nbytes -= entry.nbytes
        for digest in entry.hashes:
            if self._by_hash.get(digest) is entry:
                del self._by_hash[digest]

    def describe(self) -> dict[str, int]:
        return {
            "prompts": len(self._entries),
            "tokens": self.tokens,
            "bytes": self.nbytes,
            "max_bytes": self.max_bytes,
            "hits": self.hits,
            "reused_tokens": self.reused_tokens,
        }


def _block_hashes(tokens: Sequence[int]) -> Iterator[int]:
    digest = 0
    for end in range(BLOCK_TOKENS, len(tokens) + 1, BLOCK_TOKENS):
        digest = hash((digest, tuple(tokens[end - BLOCK_TOKENS : end])))
        yield digest


def _own(cache: KVCache) -> KVCache:
    """A copy holding only this prompt's positions (a prefill's cache may be a view into a
    padded batch, which it would otherwise keep alive)."""
    return KVCache([(key.copy(), value.copy()) for key, value in cache.layers])


def _head(cache: KVCache, length: int) -> KVCache:
    # Views: a stored cache is never written, and the prefill copies them into its batch anyway.
    return KVCache([(k[:, :, :length], v[:, :, :length]) for k, v in cache.layers])
