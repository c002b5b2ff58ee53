"""Feeding a decoder graph: prefill, batched KV-cached decode steps and full recompute.

The graph takes `input_ids`, `attention_mask`, `position_ids` and one past key/value tensor per
layer, and returns `logits` and the `present` cache. Batches of sequences with different cache
lengths are left-padded; the attention mask hides the padding, so each sequence sees only its own
cache. An empty cache is one masked slot, which keeps every graph input non-empty.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import onnxruntime as ort

from deployments.contracts.manifest import KVCacheLayout
from deployments.replica.engine.session import OnnxSession

_ORT_FLOAT = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


@dataclass
class KVCache:
    """One sequence's cache: per layer a (key, value) pair of [1, kv_heads, length, head_dim]."""

    layers: list[tuple[np.ndarray, np.ndarray]]

    @property
    def length(self) -> int:
        return int(self.layers[0][0].shape[2])


# A batch's cache between steps: host arrays, or device OrtValues when the session binds IO.
CacheTensor: TypeAlias = np.ndarray | ort.OrtValue


class DecoderGraph:
    """Runs a KV-cache decoder graph; knows nothing of requests, sampling or text."""

    def __init__(self, session: OnnxSession, layout: KVCacheLayout):
        if layout.layout != "concat":
            raise ValueError(
                f"DecoderGraph runs a 'concat' cache graph, not a {layout.layout!r} one: a "
                "'slots' graph (--attention fused) runs on slot_decoder.SlotDecoder"
            )
        self.session = session
        self.layout = layout
        # Named once: formatting them was a few microseconds of every step.
        self.past_names = [layout.past_names(i) for i in range(layout.num_layers)]
        self.present_names = [layout.present_names(i) for i in range(layout.num_layers)]
        self.cache_dtype = _ORT_FLOAT[session.input_type(self.past_names[0][0])]
        self.run_s = 0.0  # seconds inside the graph, summed: the step profile's "graph" share

    def _empty_layer(self, batch: int, length: int) -> tuple[np.ndarray, np.ndarray]:
        heads = self.layout.num_kv_heads
        return (
            np.zeros((batch, heads, length, self.layout.key_head_dim), self.cache_dtype),
            np.zeros((batch, heads, length, self.layout.value_head_dim), self.cache_dtype),
        )

    def _run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: Sequence[tuple[np.ndarray, np.ndarray]],
    ) -> tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]]]:
        """Everything through host memory: prefill and the parity references slice the cache."""
        feeds = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
        }
        for (key_name, value_name), (key, value) in zip(self.past_names, past, strict=True):
            feeds[key_name], feeds[value_name] = key, value
        started = time.perf_counter()
        out = self.session.run(feeds)
        self.run_s += time.perf_counter() - started
        return out["logits"], self._present(out)

    def _run_on_device(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        position_ids: np.ndarray,
        past: Sequence[tuple[CacheTensor, CacheTensor]],
    ) -> tuple[np.ndarray, list[tuple[CacheTensor, CacheTensor]]]:
        """A decode step whose cache stays in device memory: the past comes in as the previous
        step's present OrtValues (a host array only right after the batch was re-padded) and
        the present stays on the device; only the ids, mask, positions and logits cross."""
        host: dict[str, np.ndarray] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
        }
        device: dict[str, ort.OrtValue] = {}
        for names, pair in zip(self.past_names, past, strict=True):
            for name, tensor in zip(names, pair, strict=True):
                if isinstance(tensor, ort.OrtValue):
                    device[name] = tensor
                else:
                    host[name] = tensor
        started = time.perf_counter()
        logits, out = self.session.run_on_device(host, device, host_outputs=("logits",))
        self.run_s += time.perf_counter() - started
        return logits["logits"], self._present(out)

    def _present(self, out: Mapping[str, Any]) -> list[tuple[Any, Any]]:
        return [(out[k], out[v]) for k, v in self.present_names]

    @property
    def all_positions(self) -> bool:
        """Whether `logits` has a row per input position (as exported), not only the last."""
        logits = next(o for o in self.session.session.get_outputs() if o.name == "logits")
        return logits.shape[1] != 1

    def prefill(self, token_ids: Sequence[int]) -> tuple[np.ndarray, KVCache]:
        """Process a whole prompt; returns the last position's logits [vocab] and its cache."""
        logits, batch = self.prefill_batch([token_ids])
        return logits[0], batch.split()[0]

    def prefill_batch(self, prompts: Sequence[Sequence[int]]) -> tuple[np.ndarray, PaddedBatch]:
        """Prompts of any lengths in one run, left-padded: returns each one's last-position
        logits [rows, vocab] and their caches as a batch ready to decode (the present comes
        back padded as the batch keeps it). Padding is masked like the empty cache's slot;
        its positions repeat 0 (any value: a masked key is never attended to)."""
        rows, longest = len(prompts), max(len(p) for p in prompts)
        input_ids = np.zeros((rows, longest), dtype=np.int64)
        positions = np.zeros((rows, longest), dtype=np.int64)
        mask = np.zeros((rows, longest + 1), dtype=np.int64)  # + the empty cache's slot
        for row, prompt in enumerate(prompts):
            n = len(prompt)
            input_ids[row, longest - n :] = prompt
            positions[row, longest - n :] = np.arange(n)
            mask[row, longest + 1 - n :] = 1
        past = [self._empty_layer(rows, 1) for _ in range(self.layout.num_layers)]
        logits, present = self._run(input_ids, mask, positions, past)
        return logits[:, -1], PaddedBatch(self, present, mask, [len(p) for p in prompts])

    def prefill_after(
        self, caches: Sequence[KVCache], rests: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray, PaddedBatch]:
        """The rests of prompts whose first positions are computed (`caches`, all of one length;
        the rests all of one length too, so no row needs padding): their last positions'
        logits [rows, vocab] and the whole prompts' caches as one batch."""
        past_len, n = caches[0].length, len(rests[0])
        if any(c.length != past_len for c in caches) or any(len(r) != n for r in rests):
            raise ValueError("prefill_after runs cached starts and rests of one length each")
        rows = len(caches)
        past = [
            (
                np.concatenate([c.layers[layer][0] for c in caches]),
                np.concatenate([c.layers[layer][1] for c in caches]),
            )
            for layer in range(self.layout.num_layers)
        ]
        mask = np.ones((rows, past_len + n), dtype=np.int64)
        logits, present = self._run(
            np.asarray(rests, dtype=np.int64),
            mask,
            np.tile(np.arange(past_len, past_len + n, dtype=np.int64), (rows, 1)),
            past,
        )
        return logits[:, -1], PaddedBatch(self, present, mask, [past_len + n] * rows)

    def decode(
        self, last_tokens: Sequence[int], caches: Sequence[KVCache]
    ) -> tuple[np.ndarray, list[KVCache]]:
        """One step for a batch of sequences: returns logits [batch, vocab] and the new caches."""
        batch = PaddedBatch.of(self, caches)
        logits = batch.step(last_tokens)
        return logits, batch.split()

    def step_padded(self, batch: PaddedBatch, last_tokens: Sequence[int]) -> np.ndarray:
        input_ids = np.asarray(last_tokens, dtype=np.int64)[:, None]
        positions = np.asarray(batch.lengths, dtype=np.int64)[:, None]
        mask = np.concatenate([batch.mask, np.ones((len(batch.lengths), 1), np.int64)], axis=1)
        run = self._run_on_device if self.session.io_binding else self._run
        logits, batch.past = run(input_ids, mask, positions, batch.past)
        batch.mask = mask
        batch.lengths = [n + 1 for n in batch.lengths]
        return logits[:, -1]

    def full_logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Logits for every position with no cache reuse (the reference for parity checks)."""
        if not self.all_positions:
            raise ValueError("this graph computes next-token logits only: open it as exported")
        n = len(token_ids)
        mask = np.ones((1, n + 1), dtype=np.int64)
        mask[0, 0] = 0
        past = [self._empty_layer(1, 1) for _ in range(self.layout.num_layers)]
        logits, _ = self._run(
            np.asarray([token_ids], dtype=np.int64),
            mask,
            np.arange(n, dtype=np.int64)[None, :],
            past,
        )
        return logits[0]

    def greedy_cached(self, prompt: Sequence[int], new_tokens: int) -> list[int]:
        logits, cache = self.prefill(prompt)
        out = [int(np.argmax(logits))]
        for _ in range(new_tokens - 1):
            step_logits, (cache,) = self.decode([out[-1]], [cache])
            out.append(int(np.argmax(step_logits[0])))
        return out

    def cached_logits(self, prompt: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
        """Logits predicting each continuation token and the one after, via the KV cache."""
        logits, cache = self.prefill(prompt)
        rows = [logits]
        for token in continuation:
            step, (cache,) = self.decode([token], [cache])
            rows.append(step[0])
        return np.stack(rows)

    def greedy_full_recompute(self, prompt: Sequence[int], new_tokens: int) -> list[int]:
        ids = list(prompt)
        out: list[int] = []
        for _ in range(new_tokens):
            # The whole sequence from an empty cache each time; any graph gives its last row.
            out.append(int(np.argmax(self.prefill(ids)[0])))
            ids.append(out[-1])
        return out


class PaddedBatch:
    """Sequences decoding together: their caches left-padded into one tensor per layer.

    The graph returns the cache already padded and one longer, so it is fed straight back: a
    batch is padded once when its membership changes, not at every step."""

    def __init__(
        self,
        graph: DecoderGraph,
        past: list[tuple[CacheTensor, CacheTensor]],
        mask: np.ndarray,
        lengths: list[int],
    ):
        """`past` per layer [rows, kv_heads, width, head_dim], `mask` [rows, width] (1: a cached
        position of that row), `lengths` each row's cached positions (right-aligned)."""
        self.graph = graph
        self.past = past
        self.mask = mask
        self.lengths = lengths

    @classmethod
    def of(cls, graph: DecoderGraph, caches: Sequence[KVCache]) -> PaddedBatch:
        """Separate caches left-padded into one batch."""
        lengths = [c.length for c in caches]
        longest = max(lengths)
        mask = np.zeros((len(caches), longest), dtype=np.int64)
        for row, length in enumerate(lengths):
            mask[row, longest - length :] = 1
        if len(caches) == 1:
            return cls(graph, list(caches[0].layers), mask, lengths)
        past: list[tuple[CacheTensor, CacheTensor]] = [
            (
                _left_pad([c.layers[layer][0] for c in caches], longest),
                _left_pad([c.layers[layer][1] for c in caches], longest),
            )
            for layer in range(graph.layout.num_layers)
        ]
        return cls(graph, past, mask, lengths)

    def step(self, last_tokens: Sequence[int]) -> np.ndarray:
        """Advance every sequence by one token; returns logits [batch, vocab]."""
        return self.graph.step_padded(self, last_tokens)

    def split(self) -> list[KVCache]:
        """Each sequence's own cache again, without the padding (in host memory: the batch is
        re-padded only when its membership changes, so this copy is not paid per token)."""
        longest = self.mask.shape[1]
        past = [(_on_host(k), _on_host(v)) for k, v in self.past]
        return [
            KVCache(
                [
                    (k[row : row + 1, :, longest - n :], v[row : row + 1, :, longest - n :])
                    for k, v in past
                ]
            )
            for row, n in enumerate(self.lengths)
        ]


def _on_host(tensor: CacheTensor) -> np.ndarray:
    return tensor.numpy() if isinstance(tensor, ort.OrtValue) else tensor


def _left_pad(tensors: list[np.ndarray], length: int) -> np.ndarray:
    first = tensors[0]
    out = np.zeros((len(tensors), first.shape[1], length, first.shape[3]), first.dtype)
    for row, t in enumerate(tensors):
        out[row, :, length - t.shape[2] :] = t[0]
    return out
