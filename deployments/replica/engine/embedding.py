"""Sentence embeddings on ONNX Runtime: validate texts, tokenize, one padded forward pass.

The graph pools and normalises, so this module never imports torch or transformers (cold start).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Encoding, Tokenizer

from deployments.contracts.encoder_outputs import EmbeddingResult
from deployments.contracts.manifest import EmbeddingSpec, ModelManifest
from deployments.errors import (
    ContextLengthExceededError,
    EmptyInputError,
    InvalidRequestError,
    InvalidUTF8Error,
)
from deployments.replica.engine.session import OnnxSession, SessionConfig, open_session

OUTPUT_NAME = "embeddings"
WARMUP_TEXT = "warm up the embedding graph"
# What one extra forward pass costs, in padded tokens: measured on MiniLM with 2 CPU threads (a run
# of 8 x 20 tokens beat one padded 32 x 30 by ~30%); it stops bucketing from splitting into singles.
RUN_OVERHEAD_TOKENS = 48


def length_buckets(
    lengths: Sequence[int], run_overhead_tokens: int = RUN_OVERHEAD_TOKENS
) -> list[list[int]]:
    """Split a batch into forward passes of similar length: rows (indices into `lengths`) sorted by
    length, cut where the padding saved outweighs one more run. Exact dynamic programme over the
    sorted order, minimising padded tokens + `run_overhead_tokens` per run."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    # best[j]: cheapest cost of the first j sorted rows; cut[j]: where its last bucket starts.
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        longest = lengths[order[end - 1]]  # sorted: the bucket's last row is its longest
        for start in range(end):
            cost = best[start] + (end - start) * longest + run_overhead_tokens
            if cost < best[end]:
                best[end], cut[end] = cost, start
    buckets: list[list[int]] = []
    end = len(order)
    while end > 0:
        buckets.append(order[cut[end] : end])
        end = cut[end]
    return buckets[::-1]


@dataclass(frozen=True)
class TokenBatch:
    """Right-padded int64 ids and mask for one forward pass, plus each text's real token count."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_counts: list[int]

    def feeds(self, input_names: Sequence[str]) -> dict[str, np.ndarray]:
        available = {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            # Single-sentence embeddings are all segment 0, for graphs that still take the input.
            "token_type_ids": np.zeros_like(self.input_ids),
        }
        return {name: available[name] for name in input_names}


class SentenceTokenizer:
    """tokenizer.json as the embedding graph expects it: [CLS] ... [SEP], never truncated (the
    shipped file truncates at 128, which would hide over-long inputs), padded by us per batch."""

    def __init__(self, path: str | Path):
        self._tokenizer = Tokenizer.from_file(str(path))
        shipped_padding = self._tokenizer.padding or {}
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        pad_id = shipped_padding.get("pad_id", self._tokenizer.token_to_id("[PAD]"))
        self.pad_id: int = 0 if pad_id is None else int(pad_id)

    def encode(self, texts: Sequence[str]) -> list[Encoding]:
        return self._tokenizer.encode_batch(list(texts), add_special_tokens=True)

    def pad(self, encodings: Sequence[Encoding]) -> TokenBatch:
        counts = [len(e.ids) for e in encodings]
        input_ids = np.full((len(encodings), max(counts)), self.pad_id, dtype=np.int64)
        attention_mask = np.zeros_like(input_ids)
        for row, encoding in enumerate(encodings):
            input_ids[row, : counts[row]] = encoding.ids
            attention_mask[row, : counts[row]] = 1
        return TokenBatch(input_ids=input_ids, attention_mask=attention_mask, token_counts=counts)

    def batch(self, texts: Sequence[str]) -> TokenBatch:
        return self.pad(self.encode(texts))


def validate_texts(texts: object) -> list[str]:
    """The request's `input` as a list of non-blank, valid-UTF-8 strings, or a 400-class error."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise InvalidRequestError("input must be a list of strings", param="input")
    if len(texts) == 0:
        raise EmptyInputError("input must contain at least one string", param="input")
    for index, text in enumerate(texts):
        if not isinstance(text, str):
            raise InvalidRequestError(
                f"input[{index}] must be a string, got {type(text).__name__}", param="input"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as error:  # lone surrogates from a bad \ud8xx escape
            raise InvalidUTF8Error(
                f"input[{index}] is not valid UTF-8 (unpaired surrogate at {error.start})",
                param="input",
            ) from None
        if not text.strip():
            raise EmptyInputError(f"input[{index}] is empty or only whitespace", param="input")
    return list(texts)


class EmbeddingRuntime:
    """One embedding model directory opened on ONNX Runtime and warmed up."""

    def __init__(self, model_dir: str | Path, session_config: SessionConfig | None = None):
        started = time.perf_counter()
        self.model_dir = Path(model_dir)
        self.manifest = ModelManifest.load(self.model_dir)
        self.spec: EmbeddingSpec = _embedding_spec(self.manifest)
        if self.manifest.tokenizer is None:
            raise ValueError(f"{self.model_dir}: an embedding model needs a tokenizer")
        self.tokenizer = SentenceTokenizer(self.model_dir / self.manifest.tokenizer)
        self.session: OnnxSession = open_session(
            self.model_dir / self.manifest.graph, session_config
        )
        self._check_graph_dimension()
        self.provider = self.session.provider
        # Cold start = load_s (manifest, tokenizer, graph) + warmup_s (first run's allocations).
        self.load_s = time.perf_counter() - started
        self.warmup_s = self.session.warm_up(
            self.tokenizer.batch([WARMUP_TEXT]).feeds(self.session.input_names)
        )

    @property
    def dimension(self) -> int:
        return self.spec.dimension

    @property
    def max_length(self) -> int:
        return self.spec.max_length

    def check(self, texts: Sequence[str]) -> list[int]:
        """Validate a request without running the graph (so one bad request never fails a merged
        batch); returns each text's token count."""
        return [len(encoding.ids) for encoding in self.tokenize(texts)]

    def embed(self, texts: Sequence[str]) -> EmbeddingResult:
        """Embed all texts, in length buckets so short texts are not padded to the longest one;
        refuses (never truncates) over-long input."""
        return self.embed_tokens(self.tokenize(texts))

    def embed_tokens(self, encodings: Sequence[Encoding]) -> EmbeddingResult:
        """Embed texts `tokenize` already encoded (and checked)."""
        counts = [len(e.ids) for e in encodings]
        vectors = np.empty((len(encodings), self.dimension), dtype=np.float32)
        for rows in length_buckets(counts):
            batch = self.tokenizer.pad([encodings[row] for row in rows])
            outputs = self.session.run(batch.feeds(self.session.input_names))
            vectors[rows] = outputs[OUTPUT_NAME]
        return EmbeddingResult(vectors=vectors, token_counts=counts)

    def describe(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "load_s": round(self.load_s, 4),
            "warmup_s": round(self.warmup_s, 4),
            "dimension": self.dimension,
            "max_length": self.max_length,
        }

    def tokenize(self, texts: Sequence[str]) -> list[Encoding]:
        """The texts' tokens, validated: a 400-class error for bad input or a text past the
        model's context (refused, never truncated), before any batch runs."""
        encodings = self.tokenizer.encode(validate_texts(texts))
        for index, encoding in enumerate(encodings):
            if len(encoding.ids) > self.max_length:
                # OpenAI's wording, so clients that parse it keep working.
                raise ContextLengthExceededError(
                    f"This model's maximum context length is {self.max_length} tokens, however "
                    f"input[{index}] has {len(encoding.ids)} tokens. Please shorten the input.",
                    param="input",
                )
        return encodings

    def _check_graph_dimension(self) -> None:
        # A manifest that disagrees with its graph would serve vectors of the wrong width.
        outputs = {o.name: o for o in self.session.session.get_outputs()}
        if OUTPUT_NAME not in outputs:
            raise ValueError(f"{self.model_dir}: graph has no {OUTPUT_NAME!r} output")
        width = outputs[OUTPUT_NAME].shape[-1]
        if isinstance(width, int) and width != self.dimension:
            raise ValueError(
                f"{self.model_dir}: graph returns {width}-d vectors, manifest says {self.dimension}"
            )


def _embedding_spec(manifest: ModelManifest) -> EmbeddingSpec:
    if manifest.task != "embedding" or manifest.embedding is None:
        raise ValueError(
            f"model {manifest.name!r} is a {manifest.task} model, not an embedding one"
        )
    return manifest.embedding
