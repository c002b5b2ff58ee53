"""The step runner of a slot-cache graph (`--attention fused`, manifest `kv_cache.layout ==
"slots"`): the scheduler's `StepRunner` over a `SlotDecoder`, one slot per running sequence.

A newcomer is prefilled alone into the next free slot; a prompt longer than
`prefill_chunk_tokens` goes in chunks (`SlotDecoder.extend`) the pacer sizes (`prefill_pacing`),
and between two chunks the sequences already decoding take one decode step, so a long prompt does
not stall them for its whole prefill. While its chunks go in, the newcomer holds the last slot
and the decode steps step the slots before it. Decode steps every running sequence in slot
order; a sequence that finished or whose consumer left gives its slot back (`release`: the last
slot's sequence moves into the hole, and its owner is re-mapped; a newcomer being prefilled is
swapped back to the last slot).
Sampling, logprobs, grammars and stop strings are the plain runner's (`sequence.next_tokens`).

Under a KV budget the buffers are cut to the sequences in them after every release (`shrink`),
so what the budget counts (rows x capacity, `kv_bytes`) is what stays allocated; without one
only their capacity is cut back, once the longest sequence left needs a `grow_by` less
(`fit_capacity`: every step attends over the whole capacity); a preempted sequence gives its
slot back (`drop`) and is prefilled again later with what it generated.

The prefix cache is not served here: its entries are per-sequence caches of the plain layout. A
later change can copy a cached prefix into a slot, then `extend` the rest.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from deployments.contracts.manifest import ModelManifest
from deployments.contracts.outputs import GenerationChunk
from deployments.contracts.session_config import SessionConfig
from deployments.replica.engine.kv_budget import bytes_per_position, rounded_up
from deployments.replica.engine.sequence import SequenceState, hand_over, next_tokens
from deployments.replica.engine.session import OnnxSession, open_session, uses_cuda
from deployments.replica.engine.slot_decoder import SlotDecoder
from deployments.replica.engine.step_runner import (
    DEFAULT_PREFILL_CHUNK_TOKENS,
    DEFAULT_PREFILL_STEP_SHARE,
    EngineThread,
)

PREFIX_CACHE_OFF = (
    "not served for slot-cache models yet: its entries are plain-layout caches, "
    "and a slot would need the prefix copied in"
)


class SlotStepRunner(EngineThread):
    """Steps a `SlotDecoder` for the scheduler: `_owners[slot]` is the sequence in that slot."""

    def __init__(
        self,
        session: OnnxSession,
        decoder: SlotDecoder,
        prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
        prefill_step_share: float | None = DEFAULT_PREFILL_STEP_SHARE,
    ):
        super().__init__(session, prefill_chunk_tokens, prefill_step_share)
        self.decoder = decoder
        self.position_bytes = bytes_per_position(decoder.cache, np.dtype(np.float32).itemsize)
        self.budgeted = False  # set with a KV budget: buffers shrink to the sequences in them
        self._owners: list[SequenceState] = []
        self._filling: SequenceState | None = None  # in the last slot while its chunks go in
        self._filling_s = 0.0  # seconds its chunks took so far

    @classmethod
    def open(
        cls,
        model_dir: Path,
        manifest: ModelManifest,
        config: SessionConfig | None,
        *,
        slots: int,
        prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
        prefill_step_share: float | None = DEFAULT_PREFILL_STEP_SHARE,
    ) -> SlotStepRunner:
        """The model directory's slot-cache graph opened and warmed up: on the CPU its prepacked
        copy (`cpu_prepacked_graph`) where the export saved one."""
        spec, vocab = manifest.llm, manifest.vocab_size
        if spec is None or vocab is None:
            raise ValueError(f"{model_dir}: a slot-cache model's manifest names its vocab_size")
        config = config or SessionConfig()
        graph = model_dir / manifest.graph
        if manifest.cpu_prepacked_graph and not uses_cuda(config):
            # Optimised at export with its weights prepacked into its data file: optimising
            # again would pack them into this process's memory instead of mapping them.
            graph = model_dir / manifest.cpu_prepacked_graph
            config = config.model_copy(update={"graph_optimization": "disable"})
        session = open_session(graph, config)
        decoder = SlotDecoder(session.session, spec.kv_cache, vocab, slots, spec.context_length)
        started = time.perf_counter()
        slot, _ = decoder.prefill([spec.pad_token_id] * 4)
        decoder.step([spec.pad_token_id])
        decoder.release(slot)
        session.warmup_s = time.perf_counter() - started
        return cls(session, decoder, prefill_chunk_tokens, prefill_step_share)

    @property
    def graph_s(self) -> float:
        return self.decoder.run_s

    @property
    def active_slots(self) -> int:
        return self.decoder.active

    def budget(self, *, idle: bool) -> None:
        """From now on the buffers hold the sequences in them only (a budget counts them): cut
        now if no step runs (`idle`), else by the engine's thread at its next release."""
        self.budgeted = True
        if idle:
            self.decoder.shrink()

    @property
    def kv_bytes_in_use(self) -> int:
        return self.decoder.nbytes

    def kv_footprint(self, rows: int, longest: int) -> int:
        """Bytes of the buffers with `rows` sequences, the longest of `longest` positions."""
        d = self.decoder
        capacity = min(d.max_len, max(d.grow_by, rounded_up(longest, d.grow_by)))
        return max(rows, 1) * capacity * self.position_bytes

    def kv_bytes(self, running: Sequence[SequenceState], admitted: Sequence[SequenceState]) -> int:
        """The running ones take a decode step, and one more between two chunks of each
        newcomer's prefill; counted for the newcomers too (those prefilled first step during
        the later ones' chunks)."""
        steps = 1 + sum(self.pacer.chunks(seq.positions) - 1 for seq in admitted)
        # Before its next step a running sequence holds len(context) - 1 positions.
        longest = max(
            [seq.positions - 1 + steps for seq in running]
            + [seq.positions + steps - 1 for seq in admitted],
            default=0,
        )
        return self.kv_footprint(len(running) + len(admitted), longest)

    async def drop(self, preempted: Sequence[SequenceState]) -> None:
        gone = set(preempted)
        await self.in_thread(lambda: self._release_where(gone.__contains__))

    def cached_logits(self, prompt: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
        """On a one-slot decoder of its own over the same graph: the running sequences keep
        their slots, and this thread is the graph's only caller."""
        d = self.decoder
        scratch = SlotDecoder(d.session, d.cache, d.vocab_size, 1, d.max_len, d.grow_by)
        _, first = scratch.prefill(list(prompt))
        return np.stack([first] + [scratch.step([t])[0].copy() for t in continuation])

    async def run(
        self,
        admitted: list[SequenceState],
        running: list[SequenceState],
        keeps_batch: Callable[[list[SequenceState]], bool],
    ) -> None:
        await super().run(admitted, running, keeps_batch)
        # A consumer can leave after the thread's last look and before the scheduler reads the
        # batch, which then may not run again for a while: its slot is given back now. Read on
        # the event loop, where `cancelled` is set, so nothing changes it between look and hop.
        while any(seq.cancelled for seq in self._owners):
            await self.in_thread(self._release_gone)

    def _steps_until_change(
        self,
        loop: asyncio.AbstractEventLoop,
        admitted: list[SequenceState],
        running: list[SequenceState],
        keeps_batch: Callable[[list[SequenceState]], bool],
    ) -> None:
        """One decode step of the running sequences and the newcomers' prefills (each gets one
        token), then decode steps back to back while the batch stays as it is."""
        batch = running + admitted
        self._decode(loop)
        for seq in admitted:
            self._prefill(loop, seq, len(batch))
        while not self._closing and keeps_batch(batch):
            self._decode(loop)
        self._release_gone()

    def _decode(self, loop: asyncio.AbstractEventLoop) -> None:
        """One decode step of the sequences in slots, in slot order (but a newcomer being
        prefilled in chunks, last); their chunks to the event loop."""
        self._release_gone()
        decoding = self._owners[:-1] if self._filling is not None else list(self._owners)
        if decoding:
            hand_over(loop, decoding, self._profiled(lambda: self._step(decoding)))

    def _step(self, decoding: list[SequenceState]) -> list[GenerationChunk]:
        started = time.perf_counter()
        logits = self.decoder.step([seq.generated[-1] for seq in decoding])
        seconds = time.perf_counter() - started
        self.pacer.decoded(seconds)
        for seq in decoding:
            seq.timings.decoded(seconds, len(decoding))
        self.steps += 1
        self.max_batch_seen = max(self.max_batch_seen, len(decoding))
        return next_tokens(decoding, logits)

    def _prefill(self, loop: asyncio.AbstractEventLoop, seq: SequenceState, size: int) -> None:
        """A newcomer's prompt (and what it generated before a preemption) into a new slot: a
        long one in chunks the pacer sizes, with a decode step of the others between two; then
        its next token. Each chunk counts as a step of the profile."""
        context = seq.context
        long = len(context) > self.prefill_chunk_tokens
        self.decoder.ensure_slots(self.decoder.active + 1)  # the batch limit may have grown
        self._filling, self._filling_s = seq, 0.0
        done = 0
        try:
            while long and len(context) - done > (chunk := self._next_chunk(seq)):
                piece = context[done : done + chunk]
                self._profiled(functools.partial(self._put, seq, piece, opens=done == 0))
                done += chunk
                self._decode(loop)
            last = functools.partial(self._put, seq, context[done:], opens=done == 0)
            chunks = self._profiled(last)
        finally:
            self._filling = None
        seq.timings.prefilled(self._filling_s, size)
        self.steps += 1
        hand_over(loop, [seq], chunks)

    def _next_chunk(self, seq: SequenceState) -> int:
        return self.pacer.next_chunk(others_decoding=any(s is not seq for s in self._owners))

    def _put(self, seq: SequenceState, piece: list[int], *, opens: bool) -> list[GenerationChunk]:
        """One piece of a newcomer's prompt into its slot (the first piece opens the slot);
        after the prompt's last piece, its first token."""
        started = time.perf_counter()
        if opens:
            _, logits = self.decoder.prefill(piece)
            self._owners.append(seq)
        else:
            logits = self.decoder.extend(self.decoder.active - 1, piece)
        took = time.perf_counter() - started
        self.pacer.chunked(len(piece), took)
        self._filling_s += took
        if self.decoder.lengths[self.decoder.active - 1] < seq.positions:
            return []
        return next_tokens([seq], logits[None])

    def _release_gone(self) -> None:
        """Give back the slots of sequences that finished or whose consumer left."""
        self._release_where(lambda seq: seq.finished or seq.cancelled)

    def _release_where(self, gone: Callable[[SequenceState], bool]) -> None:
        """Give back the slots of the sequences `gone` picks. From the last slot down, so the
        sequence a release moves in was already looked at; under a budget the buffers shrink
        after."""
        released = False
        for slot in reversed(range(len(self._owners))):
            seq = self._owners[slot]
            if seq is self._filling or not gone(seq):
                continue
            released = True
            last = self._owners.pop()
            if self.decoder.release(slot) is not None:
                self._owners[slot] = last
            end = len(self._owners) - 1
            if last is self._filling and slot != end:
                # The decode steps between its chunks step the slots before the last one.
                self.decoder.swap(slot, end)
                self._owners[slot], self._owners[end] = self._owners[end], self._owners[slot]
        if released:
            # Under a budget the rows go too (what it counts stays allocated); without one the
            # rows are kept for the next newcomers.
            if self.budgeted:
                self.decoder.shrink()
            else:
                self.decoder.fit_capacity()
