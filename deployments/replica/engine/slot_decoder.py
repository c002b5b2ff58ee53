"""Running a `slots`-layout decoder graph (`--attention fused`): one preallocated KV buffer per
layer, past and present bound to the same memory, so a decode step writes one position per row.

Per layer one key and one value array [slots, kv_heads, capacity, head_dim] (float32). A sequence
owns a slot; its positions 0..length-1 are valid, the rest is never read as a key (masked). Active
sequences are kept dense in slots 0..active-1, so a step binds `buffer[:active]`, a contiguous
view: no copy, no re-padding when a sequence joins or leaves. When one leaves, the last active
sequence's valid positions move into its slot (one copy of that sequence, 0.27 ms at 256
positions in the prototype); fixed slots with holes would make every GEMM pay for the holes.

The fused graph attends over the whole bound capacity (masked), so capacity starts at `grow_by`
positions and grows in steps of `grow_by` with the longest sequence (copying the valid prefixes,
once per `grow_by` positions), never max_len up front.

A step writes into numpy arrays wrapped once as OrtValues (ids, seqlens_k, total_seq_len, logits)
and rebinds only when the number of active rows or the capacity changed.
"""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort

from deployments.contracts.manifest import KVCacheLayout

DEFAULT_GROW_BY = 256


class NoFreeSlot(RuntimeError):
    """Every slot holds a sequence: the caller must wait for one to be released."""


class SlotDecoder:
    def __init__(
        self,
        session: ort.InferenceSession,
        cache: KVCacheLayout,
        vocab_size: int,
        slots: int,
        max_len: int,
        grow_by: int = DEFAULT_GROW_BY,
    ):
        if cache.layout != "slots":
            raise ValueError(f"SlotDecoder runs a 'slots' cache graph, not {cache.layout!r}")
        self.session, self.cache, self.vocab_size = session, cache, vocab_size
        self.slots, self.max_len, self.grow_by = slots, max_len, grow_by
        self.capacity = min(grow_by, max_len)
        self.keys = [self._buffer(self.capacity) for _ in range(cache.num_layers)]
        self.values = [self._buffer(self.capacity) for _ in range(cache.num_layers)]
        self.lengths = np.zeros(slots, np.int64)  # cached positions per slot
        self.active = 0  # slots 0..active-1 hold sequences
        self._ids = np.zeros((slots, 1), np.int64)
        self._seqlens = np.zeros(slots, np.int32)
        self._total = np.zeros((), np.int32)
        self._logits = np.zeros((slots, vocab_size), np.float32)
        self._binding: ort.IOBinding | None = None
        self._bound_rows = -1
        self.run_s = 0.0  # seconds inside the graph, summed (the step profile's "graph" share)

    def _buffer(self, capacity: int) -> np.ndarray:
        c = self.cache
        return np.zeros((self.slots, c.num_kv_heads, capacity, c.key_head_dim), np.float32)

    def ensure_capacity(self, needed: int) -> None:
        """Room for a sequence of `needed` positions: grow every buffer to the next multiple of
        `grow_by`, copying the valid prefixes of the active slots."""
        if needed <= self.capacity:
            return
        if needed > self.max_len:
            raise ValueError(f"{needed} positions exceed max_len {self.max_len}")
        self._reallocate(self.slots, min(self.max_len, -(-needed // self.grow_by) * self.grow_by))

    def ensure_slots(self, needed: int) -> None:
        """Room for `needed` sequences (the batch limit can be raised while serving): every
        buffer reallocated with that many slots, the active ones copied."""
        if needed > self.slots:
            self._reallocate(needed, self.capacity)

    def shrink(self) -> None:
        """Buffers cut to the active sequences (one row at least) and the capacity the longest
        of them needs: what a KV budget counts is what stays allocated."""
        capacity = self._capacity_needed()
        rows = max(self.active, 1)
        if (rows, capacity) != (self.slots, self.capacity):
            self._reallocate(rows, capacity)

    def fit_capacity(self) -> None:
        """The capacity cut back once a whole `grow_by` of it is beyond what the longest active
        sequence needs (its next position included), the slots kept: every step attends over,
        and reads, the whole capacity of every bound slot, so a long prompt gone must not slow
        every later step (at size, 16 rows at 1,792 positions read 0.5 GB of cache a step)."""
        capacity = self._capacity_needed(ahead=1)
        if self.capacity - capacity >= self.grow_by:
            self._reallocate(self.slots, capacity)

    def _capacity_needed(self, ahead: int = 0) -> int:
        longest = int(self.lengths[: self.active].max(initial=0)) + ahead
        return min(self.max_len, max(1, -(-longest // self.grow_by)) * self.grow_by)

    @property
    def nbytes(self) -> int:
        """The KV buffers' bytes (every row and position, valid or not)."""
        return sum(b.nbytes for buffers in (self.keys, self.values) for b in buffers)

    def _reallocate(self, slots: int, capacity: int) -> None:
        keep = int(self.lengths[: self.active].max(initial=0))
        # The bound views hold the old buffers: let go first, so each old buffer is freed as
        # its replacement is filled (one layer's copy at a time, not the whole cache twice).
        self._binding = None
        self.slots, self.capacity = slots, capacity
        for buffers in (self.keys, self.values):
            for i, old in enumerate(buffers):
                grown = self._buffer(capacity)
                grown[: self.active, :, :keep] = old[: self.active, :, :keep]
                buffers[i] = grown
                del old
        if slots != len(self.lengths):
            lengths = np.zeros(slots, np.int64)
            lengths[: self.active] = self.lengths[: self.active]
            self.lengths = lengths
            self._ids = np.zeros((slots, 1), np.int64)
            self._seqlens = np.zeros(slots, np.int32)
            self._logits = np.zeros((slots, self.vocab_size), np.float32)

    def _bind(
        self,
        rows: slice,
        ids: np.ndarray,
        seqlens: np.ndarray,
        total: np.ndarray,
        logits: np.ndarray,
    ) -> ort.IOBinding:
        binding = self.session.io_binding()
        wrap = ort.OrtValue.ortvalue_from_numpy
        binding.bind_ortvalue_input("input_ids", wrap(ids))
        binding.bind_ortvalue_input("seqlens_k", wrap(seqlens))
        binding.bind_ortvalue_input("total_seq_len", wrap(total))
        binding.bind_ortvalue_output("logits", wrap(logits))
        for layer in range(self.cache.num_layers):
            past_key, past_value = self.cache.past_names(layer)
            present_key, present_value = self.cache.present_names(layer)
            # ONE OrtValue for past and present: GroupQueryAttention sees the same data pointer
            # (past_present_share_buffer) and writes only the new positions.
            key = wrap(self.keys[layer][rows])  # a view of the slot buffer, no copy
            value = wrap(self.values[layer][rows])
            binding.bind_ortvalue_input(past_key, key)
            binding.bind_ortvalue_output(present_key, key)
            binding.bind_ortvalue_input(past_value, value)
            binding.bind_ortvalue_output(present_value, value)
        return binding

    def prefill(self, prompt: list[int] | np.ndarray) -> tuple[int, np.ndarray]:
        """A prompt into the next free slot; returns (slot, the last position's logits)."""
        if self.active == self.slots:
            raise NoFreeSlot(f"all {self.slots} slots hold sequences")
        slot = self.active
        self.active += 1
        try:
            return slot, self.extend(slot, prompt)
        except BaseException:
            self.release(slot)  # the slot is free again: active counts only sequences
            raise

    def extend(self, slot: int, tokens: list[int] | np.ndarray) -> np.ndarray:
        """Tokens appended to a slot's sequence in one run (batch 1: GroupQueryAttention takes
        more than one new token per row only alone): a prompt, a chunk of one (chunked prefill),
        or a suffix after a prefix-cache hit. Returns the last position's logits."""
        if not 0 <= slot < self.active:
            raise IndexError(f"slot {slot} holds no sequence ({self.active} active)")
        past, n = int(self.lengths[slot]), len(tokens)
        self.ensure_capacity(past + n)
        logits = np.zeros((1, self._logits.shape[1]), np.float32)
        binding = self._bind(
            slice(slot, slot + 1),
            np.asarray(tokens, np.int64)[None, :],
            np.array([past + n - 1], np.int32),
            np.array(past + n, np.int32),
            logits,
        )
        self._run(binding)
        self.lengths[slot] = past + n
        return logits[0]

    def step(self, tokens: list[int] | np.ndarray) -> np.ndarray:
        """One decode step of the first len(tokens) slots (every active slot, usually; a prompt
        being prefilled in chunks into the last slot sits out), `tokens[i]` appended to slot i.
        Returns the next-token logits [len(tokens), vocab]: a view of the bound output,
        overwritten by the next step (copy what must outlive it)."""
        n = len(tokens)
        if not 0 < n <= self.active:
            raise ValueError(f"{n} tokens for {self.active} active slots")
        longest = int(self.lengths[:n].max()) + 1
        self.ensure_capacity(longest)
        if self._binding is None or self._bound_rows != n:
            self._binding = self._bind(
                slice(0, n), self._ids[:n], self._seqlens[:n], self._total, self._logits[:n]
            )
            self._bound_rows = n
        self._ids[:n, 0] = tokens
        self._seqlens[:n] = self.lengths[:n]  # the new token's position
        self._total[...] = longest
        self._run(self._binding)
        self.lengths[:n] += 1
        return self._logits[:n]

    def _run(self, binding: ort.IOBinding) -> None:
        started = time.perf_counter()
        self.session.run_with_iobinding(binding)
        self.run_s += time.perf_counter() - started

    def swap(self, a: int, b: int) -> None:
        """Exchange the sequences of two active slots (their valid positions and lengths)."""
        if not (0 <= a < self.active and 0 <= b < self.active):
            raise IndexError(f"slots {a} and {b}: {self.active} active")
        n = int(self.lengths[[a, b]].max())
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[[a, b], :, :n] = buffer[[b, a], :, :n]  # the right side is a copy
        self.lengths[[a, b]] = self.lengths[[b, a]]

    def release(self, slot: int) -> int | None:
        """Free `slot`; the last active sequence moves into it (its valid positions only).
        Returns the slot that moved, whose owner now lives at `slot`, or None."""
        if not 0 <= slot < self.active:
            raise IndexError(f"slot {slot} holds no sequence ({self.active} active)")
        last = self.active - 1
        moved = None
        if slot != last:
            n = int(self.lengths[last])
            for buffers in (self.keys, self.values):
                for buffer in buffers:
                    buffer[slot, :, :n] = buffer[last, :, :n]
            self.lengths[slot] = n
            moved = last
        self.lengths[last] = 0
        self.active -= 1
        return moved
