"""Chat generation on a KV-cache decoder graph, with continuous batching of concurrent requests.

Each request becomes a sequence with its own cache. One engine task admits waiting sequences
(prefill) and advances every running sequence by one token in a single batched forward pass, so
concurrent streams share each step; sequences join and leave between steps.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from deployments.errors import (
    ContextLengthExceededError,
    InternalServerError,
    ServingError,
)
from deployments.observability.timings import InferenceTimings
from deployments.runtime.decoder import DecoderGraph, KVCache, PaddedBatch
from deployments.runtime.manifest import ModelManifest
from deployments.runtime.sampling import SamplingParams, StopStringMatcher, sample_token
from deployments.runtime.session import SessionConfig, open_session
from deployments.runtime.tokenizer import ChatTokenizer, IncrementalDetokenizer

FinishReason = Literal["stop", "length", "content_filter"]
DEFAULT_MAX_NEW_TOKENS = 256


@dataclass(frozen=True)
class GenerationChunk:
    """New text since the previous chunk; the last chunk carries the finish reason."""

    text: str
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True)
class Completion:
    text: str
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int


@dataclass(eq=False)
class _Sequence:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    eos: frozenset[int]
    tokenizer: ChatTokenizer
    queue: asyncio.Queue[GenerationChunk | ServingError] = field(default_factory=asyncio.Queue)
    rng: np.random.Generator = field(init=False)
    matcher: StopStringMatcher = field(init=False)
    detokenizer: IncrementalDetokenizer = field(init=False)
    generated: list[int] = field(default_factory=list)
    text: str = ""
    emitted_chars: int = 0
    cache: KVCache | None = None
    timings: InferenceTimings = field(default_factory=InferenceTimings)
    finished: bool = False
    cancelled: bool = False

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.params.seed)
        self.matcher = StopStringMatcher(self.params.stop)
        self.detokenizer = IncrementalDetokenizer(self.tokenizer)

    def accept(self, logits: np.ndarray) -> GenerationChunk:
        """Sample the next token and turn it into the text that is now safe to emit."""
        token = sample_token(logits, self.params, self.rng)
        finish: FinishReason | None = None
        if token in self.eos:
            finish = "stop"
        else:
            self.generated.append(token)
            # Holds back an unfinished multi-byte character until its last byte arrives.
            self.text += self.detokenizer.push(token)
        if finish is None and len(self.generated) >= self.max_tokens:
            finish = "length"
        if finish is not None:
            self.text += self.detokenizer.flush()
        text = self.text
        stop_at = self.matcher.find(text, self.emitted_chars)
        if stop_at is not None:
            end, finish = stop_at, "stop"
        elif finish is not None:
            end = len(text)
        else:
            end = self.matcher.safe_length(text)
        delta = text[self.emitted_chars : max(end, self.emitted_chars)]
        self.emitted_chars += len(delta)
        self.finished = finish is not None
        return GenerationChunk(delta, finish, len(self.prompt), len(self.generated))


@dataclass
class StepProfile:
    """Where the engine's time goes, summed over steps: the graph (`session.run`), the rest of a
    step in the engine thread (sampling, detokenising, stop strings, batch bookkeeping), and the
    round trips between the engine thread and the event loop (what is left of `wall_s`)."""

    steps: int = 0
    tokens: int = 0
    graph_s: float = 0.0
    step_s: float = 0.0
    wall_s: float = 0.0
    hops: int = 0

    def per_step_ms(self) -> dict[str, float]:
        steps = max(self.steps, 1)
        return {
            "steps": self.steps,
            "tokens": self.tokens,
            "executor_hops": self.hops,
            "graph_ms": round(self.graph_s / steps * 1e3, 3),
            "token_python_ms": round((self.step_s - self.graph_s) / steps * 1e3, 3),
            "hop_ms": round((self.wall_s - self.step_s) / steps * 1e3, 3),
            "wall_ms": round(self.wall_s / steps * 1e3, 3),
        }


class LLMRuntime:
    """A chat model loaded from a model directory: tokenize, prefill, batched decode, stream."""

    def __init__(
        self,
        model_dir: str | Path,
        session_config: SessionConfig | None = None,
        *,
        max_batch_size: int = 8,
        default_max_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    ):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.model_dir = Path(model_dir)
        self.manifest = ModelManifest.load(self.model_dir)
        if self.manifest.task != "chat" or self.manifest.llm is None:
            raise ValueError(f"{model_dir} holds a {self.manifest.task} model, not a chat model")
        spec = self.manifest.llm
        self.context_length = spec.context_length
        self.max_batch_size = max_batch_size
        self.default_max_tokens = default_max_tokens
        self._eos = frozenset(spec.eos_token_ids)
        self.tokenizer = ChatTokenizer(
            self.model_dir / (self.manifest.tokenizer or "tokenizer.json"),
            spec.chat_template,
            spec.special_tokens,
            spec.eos_token_ids,
        )
        self.session = open_session(self.model_dir / self.manifest.graph, session_config)
        self.graph = DecoderGraph(self.session, spec.kv_cache)
        start = time.perf_counter()
        _, cache = self.graph.prefill([spec.pad_token_id] * 4)
        self.graph.decode([spec.pad_token_id], [cache])
        self.session.warmup_s = time.perf_counter() - start

        self._waiting: deque[_Sequence] = deque()
        self._running: list[_Sequence] = []
        self._engine: asyncio.Task[None] | None = None
        # One thread runs the graph so the event loop keeps serving while a step computes.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-step")
        self._batch: PaddedBatch | None = None
        self._batch_members: list[_Sequence] = []
        self.steps = 0
        self.max_batch_seen = 0
        self.profile = StepProfile()
        self._closing = False  # read by the engine thread between back-to-back steps

    # ---- request side -------------------------------------------------------------------

    def prepare(
        self, messages: Sequence[Mapping[str, Any]], params: SamplingParams
    ) -> tuple[list[int], int]:
        """Tokenize and check the context; returns (prompt ids, max new tokens)."""
        prompt = self.tokenizer.encode_chat(messages)
        room = self.context_length - len(prompt)
        if room <= 0:
            raise ContextLengthExceededError(
                f"the prompt has {len(prompt)} tokens; this model's context is "
                f"{self.context_length} tokens",
                param="messages",
            )
        if params.max_tokens is not None and params.max_tokens > room:
            raise ContextLengthExceededError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds the "
                f"context of {self.context_length} tokens",
                param="max_tokens",
            )
        return prompt, params.max_tokens or min(room, self.default_max_tokens)

    async def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: SamplingParams,
        timings: InferenceTimings | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        """Yield text as it is generated. Invalid requests raise before the first chunk."""
        prompt, max_tokens = self.prepare(messages, params)
        seq = _Sequence(prompt, params, max_tokens, self._eos, self.tokenizer)
        if timings is not None:
            seq.timings = timings
        self._waiting.append(seq)
        self._kick()
        try:
            while True:
                item = await seq.queue.get()
                if isinstance(item, ServingError):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            seq.cancelled = True  # a consumer that stops early frees its batch slot

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: SamplingParams,
        timings: InferenceTimings | None = None,
    ) -> Completion:
        parts: list[str] = []
        last: GenerationChunk | None = None
        async for chunk in self.stream(messages, params, timings):
            parts.append(chunk.text)
            last = chunk
        assert last is not None and last.finish_reason is not None
        return Completion(
            "".join(parts), last.finish_reason, last.prompt_tokens, last.completion_tokens
        )

    def describe(self) -> dict[str, Any]:
        return {
            "task": "chat",
            "family": self.manifest.family,
            "architecture": self.manifest.architecture,
            "provider": self.session.provider,
            "load_s": self.session.load_s,
            "warmup_s": self.session.warmup_s,
            "context_length": self.context_length,
            "max_batch_size": self.max_batch_size,
            "running": len(self._running),
            "waiting": len(self._waiting),
        }

    # ---- engine side --------------------------------------------------------------------

    def _kick(self) -> None:
        if self._engine is None or self._engine.done():
            self._engine = asyncio.get_running_loop().create_task(self._run_engine())

    async def _run_engine(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting or self._running:
            self._running = [s for s in self._running if not s.cancelled]
            admitted: list[_Sequence] = []
            while self._waiting and len(self._running) + len(admitted) < self.max_batch_size:
                seq = self._waiting.popleft()
                if not seq.cancelled:
                    seq.timings.admitted()
                    admitted.append(seq)
            batch = self._running + admitted
            if not batch:
                continue
            started = time.perf_counter()
            try:
                await loop.run_in_executor(
                    self._executor, self._steps_until_change, loop, admitted, self._running
                )
            except Exception as exc:  # noqa: BLE001 - a failed step fails its requests, not the engine
                error = InternalServerError(f"generation failed: {type(exc).__name__}")
                for seq in batch:
                    if not seq.finished:
                        seq.finished = True
                        seq.queue.put_nowait(error)
                self._running = []
                continue
            finally:
                self.profile.wall_s += time.perf_counter() - started
                self.profile.hops += 1
            self._running = [s for s in batch if not s.finished and not s.cancelled]

    def _steps_until_change(
        self,
        loop: asyncio.AbstractEventLoop,
        admitted: list[_Sequence],
        running: list[_Sequence],
    ) -> None:
        """Runs in the executor thread: steps back to back while the batch stays as it is (no
        sequence finished or cancelled, nobody waiting for a free slot), handing each step's
        chunks to the event loop without waiting for it. One executor round trip per batch
        change instead of one per token: on a busy machine each round trip is a thread wake-up
        that waits for a core."""
        batch = running + admitted
        chunks = self._profiled_step(admitted, running)
        loop.call_soon_threadsafe(_deliver, batch, chunks)
        while (
            not self._closing
            and not any(s.finished or s.cancelled for s in batch)
            and not (self._waiting and len(batch) < self.max_batch_size)
        ):
            chunks = self._profiled_step([], batch)
            loop.call_soon_threadsafe(_deliver, batch, chunks)

    def _profiled_step(
        self, admitted: list[_Sequence], running: list[_Sequence]
    ) -> list[GenerationChunk]:
        started, graph_before = time.perf_counter(), self.graph.run_s
        chunks = self._step(admitted, running)
        self.profile.steps += 1
        self.profile.tokens += len(chunks)
        self.profile.graph_s += self.graph.run_s - graph_before
        self.profile.step_s += time.perf_counter() - started
        return chunks

    def _step(self, admitted: list[_Sequence], running: list[_Sequence]) -> list[GenerationChunk]:
        """Runs in the executor thread: one batched decode step, then prefill newcomers."""
        chunks: list[GenerationChunk] = []
        size = len(running) + len(admitted)
        if running:
            batch = self._batch_for(running)
            started = time.perf_counter()
            logits = batch.step([s.generated[-1] for s in running])
            seconds = time.perf_counter() - started
            for seq, row in zip(running, logits, strict=True):
                seq.timings.decoded(seconds, size)
                chunks.append(seq.accept(row))
        for seq in admitted:
            started = time.perf_counter()
            logits, seq.cache = self.graph.prefill(seq.prompt)
            seq.timings.prefilled(time.perf_counter() - started, size)
            chunks.append(seq.accept(logits))
        self.steps += 1
        self.max_batch_seen = max(self.max_batch_seen, len(running))
        return chunks

    def _batch_for(self, running: list[_Sequence]) -> PaddedBatch:
        """The padded batch of exactly these sequences; rebuilt only when membership changed."""
        if self._batch is not None and self._batch_members == running:
            return self._batch
        if self._batch is not None:
            for seq, cache in zip(self._batch_members, self._batch.split(), strict=True):
                seq.cache = cache
        self._batch = PaddedBatch(self.graph, [s.cache for s in running])  # type: ignore[misc]
        self._batch_members = list(running)
        return self._batch

    def close(self) -> None:
        self._closing = True
        self._executor.shutdown(wait=False, cancel_futures=True)


def _deliver(batch: list[_Sequence], chunks: list[GenerationChunk]) -> None:
    """On the event loop: each sequence's chunk of one step to its consumer."""
    for seq, chunk in zip(batch, chunks, strict=True):
        seq.queue.put_nowait(chunk)
