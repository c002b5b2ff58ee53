"""The chat engine's step runners: one thread that runs the decoder graph, a step at a time, for
the batch the scheduler hands it. `EngineThread` is what every runner shares (the thread, one hop
to it per batch change, the counters and the profile: `step_profile`); `DecoderStepRunner` runs
the plain (`concat` cache) graph: prefill newcomers (on their cached prefix where there is one),
one batched decode step for the rest, sampling, and the padded batch kept between steps. Under a
KV budget the padded batch counts rows x longest positions, and the prefix cache gets what the
batch leaves (it is evicted first, before any sequence is preempted). The slot-cache graph has
its own runner (`slot_step_runner`).
"""

from __future__ import annotations

import abc
import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import numpy as np

from deployments.contracts.manifest import ModelManifest
from deployments.contracts.outputs import GenerationChunk
from deployments.contracts.session_config import SessionConfig
from deployments.replica.engine.decoder import DecoderGraph, PaddedBatch
from deployments.replica.engine.kv_budget import KVBudget, bytes_per_position
from deployments.replica.engine.next_token_graph import next_token_only
from deployments.replica.engine.prefill_pacing import PrefillPacer
from deployments.replica.engine.prefix_cache import PrefixCache, PrefixHit
from deployments.replica.engine.scheduler import prefill_runs
from deployments.replica.engine.sequence import SequenceState, hand_over, next_tokens
from deployments.replica.engine.session import OnnxSession, open_session
from deployments.replica.engine.step_profile import StepProfile

R = TypeVar("R")

# Tokens per prefill chunk (both graphs), the most: a prompt longer than this is a long one, and
# goes in chunks. A chunk's cost grows with its length times the cache it attends to (the fused
# graph materialises chunk x 16 x capacity scores per KV head); in the prototype, at size (fp32,
# 2 threads), 1,500 tokens took 16.5 s unchunked and 7.9 s in chunks of 512 on the fused graph,
# so a chunk of 256 costs a running stream about one second between two of its tokens.
DEFAULT_PREFILL_CHUNK_TOKENS = 256
# While others decode, a long prompt's chunk can be paced to a share of their decode step
# (`prefill_pacing`), so their gaps stay within about (1 + share) steps. Off by default: a
# chunk's fixed cost (the weights read once) makes small chunks slow, and at size a 1,500-token
# prompt beside 8 streams answered in 3.6 s unpaced, 15.9 s at 1.0 (in process; served 4.0-4.7
# against 32.0-34.8 s: docs/performance.md).
DEFAULT_PREFILL_STEP_SHARE: float | None = None


class EngineThread(abc.ABC):
    """What every step runner shares: its one thread, so the event loop keeps serving while a
    step computes (the graph is not shared), one executor round trip per batch change, the
    counters the benchmarks read and the step profile."""

    def __init__(
        self,
        session: OnnxSession,
        prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
        prefill_step_share: float | None = DEFAULT_PREFILL_STEP_SHARE,
    ):
        self.session = session
        self.pacer = PrefillPacer(DEFAULT_PREFILL_CHUNK_TOKENS, prefill_step_share)
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-step")
        self.steps = 0
        self.max_batch_seen = 0
        self.profile = StepProfile()
        self._closing = False  # read by the engine thread between back-to-back steps

    @property
    @abc.abstractmethod
    def graph_s(self) -> float:
        """Seconds inside the graph so far (the profile's "graph" share)."""

    @abc.abstractmethod
    def cached_logits(self, prompt: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
        """Logits predicting each continuation token and the one after, via the KV cache (on the
        engine's thread, between steps: prompt logprobs)."""

    @property
    @abc.abstractmethod
    def kv_bytes_in_use(self) -> int:
        """Bytes the KV cache holds now (the prefix cache's included)."""

    @abc.abstractmethod
    def kv_footprint(self, rows: int, longest: int) -> int:
        """Bytes the cache holds for `rows` sequences, the longest of `longest` positions."""

    @abc.abstractmethod
    def kv_bytes(self, running: Sequence[SequenceState], admitted: Sequence[SequenceState]) -> int:
        """The scheduler's `StepRunner.kv_bytes`."""

    @abc.abstractmethod
    async def drop(self, preempted: Sequence[SequenceState]) -> None:
        """The scheduler's `StepRunner.drop`."""

    @abc.abstractmethod
    def _steps_until_change(
        self,
        loop: asyncio.AbstractEventLoop,
        admitted: list[SequenceState],
        running: list[SequenceState],
        keeps_batch: Callable[[list[SequenceState]], bool],
    ) -> None:
        """Runs in the executor thread: `run`'s work, each step's chunks handed to the event
        loop (`hand_over`) without waiting for it."""

    @property
    def prefill_chunk_tokens(self) -> int:
        """A prompt longer than this goes in chunks, at most this long (`PrefillPacer`)."""
        return self.pacer.largest

    @prefill_chunk_tokens.setter
    def prefill_chunk_tokens(self, tokens: int) -> None:
        if tokens < 1:
            raise ValueError("prefill_chunk_tokens must be at least 1")
        self.pacer.largest = tokens

    async def in_thread(self, work: Callable[[], R]) -> R:
        """Run `work` on the engine's thread, between its steps (the graph is not shared)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    async def run(
        self,
        admitted: list[SequenceState],
        running: list[SequenceState],
        keeps_batch: Callable[[list[SequenceState]], bool],
    ) -> None:
        """The scheduler's `StepRunner.run`, in one executor round trip: on a busy machine each
        round trip is a thread wake-up that waits for a core."""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self._executor, self._steps_until_change, loop, admitted, running, keeps_batch
            )
        finally:
            self.profile.wall_s += time.perf_counter() - started
            self.profile.hops += 1

    def _profiled(self, step: Callable[[], list[GenerationChunk]]) -> list[GenerationChunk]:
        started, graph_before = time.perf_counter(), self.graph_s
        chunks = step()
        self.profile.steps += 1
        self.profile.tokens += len(chunks)
        self.profile.graph_s += self.graph_s - graph_before
        self.profile.step_s += time.perf_counter() - started
        return chunks

    def close(self) -> None:
        self._closing = True
        self._executor.shutdown(wait=False, cancel_futures=True)


class DecoderStepRunner(EngineThread):
    """Steps a `DecoderGraph` for the scheduler (its `StepRunner`)."""

    def __init__(
        self,
        session: OnnxSession,
        graph: DecoderGraph,
        prefix_cache: PrefixCache,
        prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
        prefill_step_share: float | None = DEFAULT_PREFILL_STEP_SHARE,
    ):
        super().__init__(session, prefill_chunk_tokens, prefill_step_share)
        self.graph = graph
        self.prefix_cache = prefix_cache
        # Each newcomer's start, looked up once before its step (`_ahead_in_chunks`): its
        # cached prefix, or for a long one the positions computed chunk by chunk (None: neither),
        # and the seconds the chunks took; its step prefills the rest on it.
        self._ahead: dict[SequenceState, tuple[PrefixHit | None, float]] = {}
        self._batch: PaddedBatch | None = None
        self._batch_members: list[SequenceState] = []
        itemsize = np.dtype(graph.cache_dtype).itemsize
        self.position_bytes = bytes_per_position(graph.layout, itemsize)
        self.budget = KVBudget()  # the engine's, shared with its scheduler
        self._sequence_bytes = 0  # the batch's, as of its last step

    @classmethod
    def open(
        cls,
        model_dir: Path,
        manifest: ModelManifest,
        config: SessionConfig | None,
        prefix_cache: PrefixCache,
        prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
        prefill_step_share: float | None = DEFAULT_PREFILL_STEP_SHARE,
    ) -> DecoderStepRunner:
        """The model directory's graph opened (rewritten to compute the last position's logits
        only, where it can be) and warmed up."""
        assert manifest.llm is not None
        started = time.perf_counter()
        graph_path = model_dir / manifest.graph
        rewritten = next_token_only(graph_path)
        session = open_session(rewritten or graph_path, config, external_data_dir=graph_path.parent)
        session.load_s = time.perf_counter() - started  # the rewrite is part of loading
        graph = DecoderGraph(session, manifest.llm.kv_cache)
        started = time.perf_counter()
        pad = manifest.llm.pad_token_id
        _, cache = graph.prefill([pad] * 4)
        graph.decode([pad], [cache])
        session.warmup_s = time.perf_counter() - started
        return cls(session, graph, prefix_cache, prefill_chunk_tokens, prefill_step_share)

    @property
    def graph_s(self) -> float:
        return self.graph.run_s

    @property
    def active_slots(self) -> int:
        """Sequences in the padded batch (as the slot runner's slots holding one)."""
        return len(self._batch_members)

    def cached_logits(self, prompt: Sequence[int], continuation: Sequence[int]) -> np.ndarray:
        return self.graph.cached_logits(prompt, continuation)

    @property
    def kv_bytes_in_use(self) -> int:
        return self._sequence_bytes + self.prefix_cache.nbytes

    def kv_footprint(self, rows: int, longest: int) -> int:
        """A padded batch of `rows` sequences, the longest of `longest` positions (and the
        empty cache's masked slot)."""
        return rows * (longest + 1) * self.position_bytes if rows else 0

    def kv_bytes(self, running: Sequence[SequenceState], admitted: Sequence[SequenceState]) -> int:
        """One step: the running ones take a position each, and one more between two chunks of
        each long newcomer's prefill; the newcomers their context."""
        between = sum(self.pacer.chunks(seq.positions) - 1 for seq in admitted)
        longest = max(
            [seq.positions + between for seq in running] + [seq.positions for seq in admitted],
            default=0,
        )
        return self.kv_footprint(len(running) + len(admitted), longest)

    async def drop(self, preempted: Sequence[SequenceState]) -> None:
        await self.in_thread(lambda: self._drop(set(preempted)))

    def _drop(self, gone: set[SequenceState]) -> None:
        if self._batch is not None and not gone.isdisjoint(self._batch_members):
            for seq, cache in zip(self._batch_members, self._batch.split(), strict=True):
                seq.cache = cache
            self._batch, self._batch_members = None, []
        for seq in gone:
            seq.cache = None
            self._ahead.pop(seq, None)

    def _steps_until_change(
        self,
        loop: asyncio.AbstractEventLoop,
        admitted: list[SequenceState],
        running: list[SequenceState],
        keeps_batch: Callable[[list[SequenceState]], bool],
    ) -> None:
        """A long newcomer's prompt goes in chunks first, the running sequences taking a decode
        step between two (`_ahead_in_chunks`); then one step with every newcomer's prefill, and
        steps back to back while the batch stays as it is (`keeps_batch`)."""
        for seq in admitted:
            running = self._ahead_in_chunks(loop, seq, running)
        batch = running + admitted
        hand_over(loop, batch, self._profiled(lambda: self.step(admitted, running)))
        while not self._closing and keeps_batch(batch):
            hand_over(loop, batch, self._profiled(lambda: self.step([], batch)))

    def _ahead_in_chunks(
        self, loop: asyncio.AbstractEventLoop, seq: SequenceState, running: list[SequenceState]
    ) -> list[SequenceState]:
        """All but the last chunk of a newcomer's context (after its cached prefix) computed
        now, in chunks the pacer sizes (`prefill_chunk_tokens` at most), the running sequences
        taking a decode step after each, so a long prompt does not stall their streams for its
        whole prefill. Returns the running sequences still going."""
        context = seq.context
        hit = self.prefix_cache.match(context)
        if hit is not None and not seq.generated:  # reported of the prompt, once
            seq.cached_tokens = hit.length
        self._ahead[seq] = (hit, 0.0)
        done = hit.length if hit is not None else 0
        if len(context) - done <= self.prefill_chunk_tokens:
            return running
        cache = hit.cache if hit is not None else None
        seconds = 0.0
        while len(context) - done > (chunk := self.pacer.next_chunk(others_decoding=bool(running))):
            piece = context[done : done + chunk]
            started = time.perf_counter()
            if cache is None:
                _, cache = self.graph.prefill(piece)
            else:
                cache = self.graph.prefill_after([cache], [piece])[1].split()[0]
            took = time.perf_counter() - started
            self.pacer.chunked(len(piece), took)
            seconds += took
            done += chunk
            self._ahead[seq] = (PrefixHit(done, cache), seconds)
            if running:
                hand_over(loop, running, self._profiled(functools.partial(self.step, [], running)))
                running = [s for s in running if not (s.finished or s.cancelled)]
        return running

    def step(
        self, admitted: list[SequenceState], running: list[SequenceState]
    ) -> list[GenerationChunk]:
        """Runs in the executor thread: one batched decode step, prefill newcomers, then sample
        the next token of every sequence in one pass."""
        blocks: list[np.ndarray] = []
        size = len(running) + len(admitted)
        self._sequence_bytes = self.kv_bytes(running, admitted)
        if self.budget.limit_bytes is not None:
            self.prefix_cache.fit_within(self.budget.limit_bytes - self._sequence_bytes)
        if running:
            batch = self._batch_for(running)
            started = time.perf_counter()
            blocks.append(batch.step([s.generated[-1] for s in running]))
            seconds = time.perf_counter() - started
            self.pacer.decoded(seconds)
            for seq in running:
                seq.timings.decoded(seconds, size)
        if admitted:
            blocks.append(self._prefill(admitted, size, batch_is_new=not running))
        logits = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
        chunks = next_tokens(running + admitted, logits)
        self.steps += 1
        self.max_batch_seen = max(self.max_batch_seen, len(running))
        return chunks

    def _prefill(
        self, admitted: list[SequenceState], batch_size: int, *, batch_is_new: bool
    ) -> np.ndarray:
        """The newcomers' prompts: those whose start is cached (`prefix_cache`) have only their
        rest prefilled, on it; runs as `scheduler.prefill_runs` groups them. Returns their
        last-position logits in admission order. When they alone form the next step's batch
        and share one run, that run's padded cache is the batch: no split and re-pad."""
        rows: list[np.ndarray] = [np.empty(0)] * len(admitted)
        # After a preemption a sequence is prefilled again with the tokens it generated.
        contexts = [seq.context for seq in admitted]
        ahead = [self._ahead.pop(seq, None) for seq in admitted]  # None: not looked up yet
        hits = [
            looked[0] if looked is not None else self.prefix_cache.match(context)
            for looked, context in zip(ahead, contexts, strict=True)
        ]
        for seq, hit, looked in zip(admitted, hits, ahead, strict=True):
            if hit is not None and looked is None and not seq.generated:  # of the prompt, once
                seq.cached_tokens = hit.length
        runs = prefill_runs(
            [len(context) for context in contexts],
            [None if hit is None else hit.length for hit in hits],
        )
        for group in runs:
            started = time.perf_counter()
            cached = [hit for i in group if (hit := hits[i]) is not None]
            if cached:
                logits, prefilled = self.graph.prefill_after(
                    [hit.cache for hit in cached],
                    [contexts[i][hit.length :] for i, hit in zip(group, cached, strict=True)],
                )
            else:
                logits, prefilled = self.graph.prefill_batch([contexts[i] for i in group])
            seconds = time.perf_counter() - started
            caches = prefilled.split()
            if batch_is_new and len(group) == len(admitted):
                self._batch, self._batch_members = prefilled, list(admitted)
            else:
                for i, cache in zip(group, caches, strict=True):
                    admitted[i].cache = cache
            for i, row, cache in zip(group, logits, caches, strict=True):
                chunks_s = ahead_i[1] if (ahead_i := ahead[i]) is not None else 0.0
                admitted[i].timings.prefilled(seconds + chunks_s, batch_size)
                rows[i] = row
                self.prefix_cache.store(contexts[i], cache)
        return np.stack(rows)

    def _batch_for(self, running: list[SequenceState]) -> PaddedBatch:
        """The padded batch of exactly these sequences; rebuilt only when membership changed."""
        if self._batch is not None and self._batch_members == running:
            return self._batch
        if self._batch is not None:
            for seq, cache in zip(self._batch_members, self._batch.split(), strict=True):
                seq.cache = cache
        self._batch = PaddedBatch.of(self.graph, [s.cache for s in running])  # type: ignore[misc]
        self._batch_members = list(running)
        return self._batch
