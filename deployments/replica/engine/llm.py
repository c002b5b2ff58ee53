"""Chat generation on a KV-cache decoder graph, with continuous batching of concurrent requests.

Each request becomes a sequence with its own cache. One engine task admits waiting sequences
(prefill) and advances every running sequence by one token in a single batched forward pass, so
concurrent streams share each step; sequences join and leave between steps. What a generation
is asked is in `sampling_params`, what it returns in `outputs`, one sequence's state in
`sequence`, where the engine's time goes in `step_profile`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from deployments.contracts.manifest import ModelManifest
from deployments.contracts.outputs import (
    Completion,
    GenerationChunk,
    PromptTokenLogprob,
    TokenLogprob,
)
from deployments.contracts.sampling_params import (
    DEFAULT_MAX_NEW_TOKENS,
    GenerationOptions,
    SamplingParams,
)
from deployments.errors import (
    ContextLengthExceededError,
    InternalServerError,
    InvalidRequestError,
    ServingError,
)
from deployments.observability.timings import InferenceTimings
from deployments.replica.engine.allocator import keep_freed_memory
from deployments.replica.engine.decoder import DecoderGraph, PaddedBatch
from deployments.replica.engine.grammar import GrammarCompiler
from deployments.replica.engine.next_token_graph import next_token_only
from deployments.replica.engine.prefix_cache import DEFAULT_MAX_BYTES as PREFIX_CACHE_BYTES
from deployments.replica.engine.prefix_cache import PrefixCache
from deployments.replica.engine.sampling import SamplingState, log_softmax, sample_batch
from deployments.replica.engine.sequence import SequenceState, coalesced, hand_over
from deployments.replica.engine.session import SessionConfig, open_session
from deployments.replica.engine.step_profile import StepProfile
from deployments.replica.engine.tokenizer import ChatTokenizer

DEFAULT_MAX_CHOICES = 8
# Batched prefill (see `prefill_groups`).
PREFILL_MAX_PADDED_TOKENS = 512
PREFILL_MIN_FILL = 0.75


class LLMRuntime:
    """A chat model loaded from a model directory: tokenize, prefill, batched decode, stream."""

    def __init__(
        self,
        model_dir: str | Path,
        session_config: SessionConfig | None = None,
        *,
        max_batch_size: int = 8,
        default_max_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        max_choices: int = DEFAULT_MAX_CHOICES,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
    ):
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        keep_freed_memory()  # a decode step's temporaries are reused, not re-mapped, each step
        self.model_dir = Path(model_dir)
        self.manifest = ModelManifest.load(self.model_dir)
        if self.manifest.task != "chat" or self.manifest.llm is None:
            raise ValueError(f"{model_dir} holds a {self.manifest.task} model, not a chat model")
        spec = self.manifest.llm
        self.context_length = spec.context_length
        self.max_batch_size = max_batch_size
        self.default_max_tokens = default_max_tokens
        self.max_choices = max_choices
        self._eos = frozenset(spec.eos_token_ids)
        self.tokenizer = ChatTokenizer(
            self.model_dir / (self.manifest.tokenizer or "tokenizer.json"),
            spec.chat_template,
            spec.special_tokens,
            spec.eos_token_ids,
        )
        # Built on first use: a model that never sees a grammar never pays for one.
        self._grammar_compiler: GrammarCompiler | None = None
        self.vocab_size = self.manifest.vocab_size or self.tokenizer.vocab_size
        started = time.perf_counter()
        graph_path = self.model_dir / self.manifest.graph
        next_token_graph = next_token_only(graph_path)
        self.session = open_session(
            next_token_graph or graph_path, session_config, external_data_dir=graph_path.parent
        )
        self.session.load_s = time.perf_counter() - started  # the rewrite is part of loading
        self.graph = DecoderGraph(self.session, spec.kv_cache)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        start = time.perf_counter()
        _, cache = self.graph.prefill([spec.pad_token_id] * 4)
        self.graph.decode([spec.pad_token_id], [cache])
        self.session.warmup_s = time.perf_counter() - start

        self._waiting: deque[SequenceState] = deque()
        self._running: list[SequenceState] = []
        self._engine: asyncio.Task[None] | None = None
        # One thread runs the graph so the event loop keeps serving while a step computes.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-step")
        self._batch: PaddedBatch | None = None
        self._batch_members: list[SequenceState] = []
        self.steps = 0
        self.max_batch_seen = 0
        self.profile = StepProfile()
        self._closing = False  # read by the engine thread between back-to-back steps

    # ---- request side -------------------------------------------------------------------

    @property
    def grammar_compiler(self) -> GrammarCompiler:
        if self._grammar_compiler is None:
            self._grammar_compiler = GrammarCompiler(
                self.model_dir / (self.manifest.tokenizer or "tokenizer.json"),
                sorted(self._eos),
                self.vocab_size,
            )
        return self._grammar_compiler

    def prepare(
        self,
        messages: Sequence[Mapping[str, Any]] | str,
        params: SamplingParams,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> tuple[list[int], int]:
        """Tokenize and check the context; returns (prompt ids, max new tokens). A string is a
        raw prompt: no chat template, and special-token strings in it stay text."""
        if isinstance(messages, str):
            prompt = self.tokenizer.encode_text(messages)
        else:
            prompt = self.tokenizer.encode_chat(messages, tools=tools)
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

    def stream(
        self,
        messages: Sequence[Mapping[str, Any]] | str,
        params: SamplingParams,
        options: GenerationOptions | None = None,
        timings: InferenceTimings | None = None,
    ) -> AsyncIterator[GenerationChunk]:
        """Yield text as it is generated, for `options.n` choices decoded side by side in the
        batch (chunks say which by `index`). `options.tools` reach the chat template;
        `options.grammar` constrains every choice. Invalid requests raise before the first
        chunk. A consumer that fell behind gets everything generated since its last chunk in
        one chunk per choice."""
        return self._generate(messages, params, options or GenerationOptions(), timings, True)

    async def _generate(
        self,
        messages: Sequence[Mapping[str, Any]] | str,
        params: SamplingParams,
        options: GenerationOptions,
        timings: InferenceTimings | None,
        streams: bool,
    ) -> AsyncIterator[GenerationChunk]:
        """`stream`'s chunks; with `streams` False, one chunk per choice when it finished (the
        event loop is not woken for every token of an answer nobody reads before its end)."""
        n = options.n
        if not 1 <= n <= self.max_choices:
            raise InvalidRequestError(
                f"n must be between 1 and {self.max_choices}, got {n}", param="n"
            )
        prompt, max_tokens = self.prepare(messages, params, list(options.tools) or None)
        queue: asyncio.Queue[GenerationChunk | ServingError] = asyncio.Queue()
        grammar = options.grammar
        choices = [
            SequenceState(
                prompt,
                params,
                max_tokens,
                self._eos,
                self.tokenizer,
                SamplingState(params, self.vocab_size, prompt, seed_offset=index),
                queue=queue,
                index=index,
                constraint=self.grammar_compiler.compile(grammar) if grammar else None,
                keep_special_tokens=options.keep_special_tokens,
                streams=streams,
            )
            for index in range(n)
        ]
        if timings is not None:
            choices[0].timings = timings
        prompt_logprobs = None
        if params.prompt_logprobs is not None:
            prompt_logprobs = await self.prompt_logprobs(prompt, params.prompt_logprobs)
        self._waiting.extend(choices)
        self._kick()
        unfinished = n
        untold = set(range(n))  # the choices whose first chunk is still to come
        try:
            while unfinished:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                for chunk in coalesced(items):
                    if prompt_logprobs is not None and chunk.index in untold:
                        untold.discard(chunk.index)
                        chunk = dataclasses.replace(chunk, prompt_logprobs=prompt_logprobs)
                    yield chunk
                    if chunk.finish_reason is not None:
                        unfinished -= 1
        finally:
            for seq in choices:
                seq.cancelled = True  # a consumer that stops early frees its batch slots

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]] | str,
        params: SamplingParams,
        options: GenerationOptions | None = None,
        timings: InferenceTimings | None = None,
    ) -> Completion:
        """The first (usually only) choice; `options` as for `stream`."""
        return (await self.complete_choices(messages, params, options, timings))[0]

    async def complete_choices(
        self,
        messages: Sequence[Mapping[str, Any]] | str,
        params: SamplingParams,
        options: GenerationOptions | None = None,
        timings: InferenceTimings | None = None,
    ) -> list[Completion]:
        parts: dict[int, list[str]] = {}
        logprobs: dict[int, list[TokenLogprob]] = {}
        last: dict[int, GenerationChunk] = {}
        prompt_logprobs = None
        chunks = self._generate(messages, params, options or GenerationOptions(), timings, False)
        async for chunk in chunks:
            parts.setdefault(chunk.index, []).append(chunk.text)
            logprobs.setdefault(chunk.index, []).extend(chunk.logprobs)
            last[chunk.index] = chunk
            prompt_logprobs = prompt_logprobs or chunk.prompt_logprobs
        done = []
        for index in sorted(last):
            final = last[index]
            assert final.finish_reason is not None
            done.append(
                Completion(
                    "".join(parts[index]),
                    final.finish_reason,
                    final.prompt_tokens,
                    final.completion_tokens,
                    index=index,
                    logprobs=tuple(logprobs[index]) if params.logprobs else None,
                    prompt_logprobs=prompt_logprobs,
                    cached_tokens=final.cached_tokens,
                )
            )
        return done

    async def prompt_logprobs(
        self, prompt: Sequence[int], top: int
    ) -> tuple[PromptTokenLogprob, ...]:
        """Each prompt token's logprob given the tokens before it, with its `top` alternatives.
        The served graph computes next-token logits only (next_token_graph), so the prompt is
        fed one token at a time through the KV cache, each step's logits scoring the next
        token: one step per prompt token, only for requests that ask, on the engine's thread
        (between its steps)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._score_prompt, prompt, top)

    def _score_prompt(self, prompt: Sequence[int], top: int) -> tuple[PromptTokenLogprob, ...]:
        rows: Sequence[np.ndarray] | np.ndarray = []
        if len(prompt) > 1:
            rows = self.graph.cached_logits(prompt[:1], prompt[1:-1])
        first = self._token_text(prompt[0])
        scored = [PromptTokenLogprob(first.token, first.token_bytes, None)]
        for token, logits in zip(prompt[1:], rows, strict=True):
            logprobs = log_softmax(np.asarray(logits, dtype=np.float64))
            best = np.argsort(-logprobs, kind="stable")[:top]
            described = self._token_text(token)
            scored.append(
                PromptTokenLogprob(
                    described.token,
                    described.token_bytes,
                    float(logprobs[token]),
                    tuple(self._token_text(int(t), float(logprobs[t])) for t in best),
                )
            )
        return tuple(scored)

    def _token_text(self, token: int, logprob: float = 0.0) -> TokenLogprob:
        raw = self.tokenizer.token_bytes(token, skip_special_tokens=False)
        return TokenLogprob(raw.decode("utf-8", errors="replace"), raw, logprob)

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
            "prefix_cache": self.prefix_cache.describe(),
        }

    # ---- engine side --------------------------------------------------------------------

    def _kick(self) -> None:
        if self._engine is None or self._engine.done():
            self._engine = asyncio.get_running_loop().create_task(self._run_engine())

    async def _run_engine(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting or self._running:
            self._running = [s for s in self._running if not s.cancelled]
            admitted: list[SequenceState] = []
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
        admitted: list[SequenceState],
        running: list[SequenceState],
    ) -> None:
        """Runs in the executor thread: steps back to back while the batch stays as it is (no
        sequence finished or cancelled, nobody waiting for a free slot), handing each step's
        chunks to the event loop without waiting for it. One executor round trip per batch
        change instead of one per token: on a busy machine each round trip is a thread wake-up
        that waits for a core."""
        batch = running + admitted
        hand_over(loop, batch, self._profiled_step(admitted, running))
        while (
            not self._closing
            and not any(s.finished or s.cancelled for s in batch)
            and not (self._waiting and len(batch) < self.max_batch_size)
        ):
            hand_over(loop, batch, self._profiled_step([], batch))

    def _profiled_step(
        self, admitted: list[SequenceState], running: list[SequenceState]
    ) -> list[GenerationChunk]:
        started, graph_before = time.perf_counter(), self.graph.run_s
        chunks = self._step(admitted, running)
        self.profile.steps += 1
        self.profile.tokens += len(chunks)
        self.profile.graph_s += self.graph.run_s - graph_before
        self.profile.step_s += time.perf_counter() - started
        return chunks

    def _step(
        self, admitted: list[SequenceState], running: list[SequenceState]
    ) -> list[GenerationChunk]:
        """Runs in the executor thread: one batched decode step, prefill newcomers, then sample
        the next token of every sequence in one pass."""
        blocks: list[np.ndarray] = []
        size = len(running) + len(admitted)
        if running:
            batch = self._batch_for(running)
            started = time.perf_counter()
            blocks.append(batch.step([s.generated[-1] for s in running]))
            seconds = time.perf_counter() - started
            for seq in running:
                seq.timings.decoded(seconds, size)
        if admitted:
            blocks.append(self._prefill(admitted, size, batch_is_new=not running))
        batch_seqs = running + admitted
        logits = blocks[0] if len(blocks) == 1 else np.concatenate(blocks)
        allowed = None
        if any(seq.constraint is not None for seq in batch_seqs):
            allowed = np.ones(logits.shape, bool)
            for i, mask in enumerate(seq.allowed() for seq in batch_seqs):
                if mask is not None:
                    allowed[i, : len(mask)] = mask
                    allowed[i, len(mask) :] = False
        sampled = sample_batch(logits, [s.sampling for s in batch_seqs], allowed)
        chunks = [seq.accept(token) for seq, token in zip(batch_seqs, sampled, strict=True)]
        self.steps += 1
        self.max_batch_seen = max(self.max_batch_seen, len(running))
        return chunks

    def _prefill(
        self, admitted: list[SequenceState], batch_size: int, *, batch_is_new: bool
    ) -> np.ndarray:
        """The newcomers' prompts: those whose start is cached (`prefix_cache`) have only their
        rest prefilled, on it, in one graph run per cached length and rest length; the others
        several to a run (`prefill_groups`). Returns their last-position logits in admission
        order. When they alone form the next step's batch and share one run, that run's
        padded cache is the batch: no split and re-pad."""
        rows: list[np.ndarray] = [np.empty(0)] * len(admitted)
        hits = {i: self.prefix_cache.match(seq.prompt) for i, seq in enumerate(admitted)}
        fresh = [i for i, hit in hits.items() if hit is None]
        on_cached: dict[tuple[int, int], list[int]] = {}
        for i, hit in hits.items():
            if hit is not None:
                admitted[i].cached_tokens = hit.length
                shape = (hit.length, len(admitted[i].prompt) - hit.length)
                on_cached.setdefault(shape, []).append(i)
        runs = list(on_cached.values()) + [
            [fresh[j] for j in group]
            for group in prefill_groups([len(admitted[i].prompt) for i in fresh])
        ]
        for group in runs:
            started = time.perf_counter()
            cached = [hit for i in group if (hit := hits[i]) is not None]
            if cached:
                logits, prefilled = self.graph.prefill_after(
                    [hit.cache for hit in cached],
                    [
                        admitted[i].prompt[hit.length :]
                        for i, hit in zip(group, cached, strict=True)
                    ],
                )
            else:
                logits, prefilled = self.graph.prefill_batch([admitted[i].prompt for i in group])
            seconds = time.perf_counter() - started
            caches = prefilled.split()
            if batch_is_new and len(group) == len(admitted):
                self._batch, self._batch_members = prefilled, list(admitted)
            else:
                for i, cache in zip(group, caches, strict=True):
                    admitted[i].cache = cache
            for i, row, cache in zip(group, logits, caches, strict=True):
                admitted[i].timings.prefilled(seconds, batch_size)
                rows[i] = row
                self.prefix_cache.store(admitted[i].prompt, cache)
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

    def close(self) -> None:
        self._closing = True
        self._executor.shutdown(wait=False, cancel_futures=True)


def prefill_groups(lengths: Sequence[int]) -> list[list[int]]:
    """Which prompts (by index, each group in index order) share a prefill run. Shortest first,
    a prompt joins the group before it while the padded run stays within
    PREFILL_MAX_PADDED_TOKENS and at least PREFILL_MIN_FILL of it is real tokens. One run saves
    each further prompt a run's fixed cost, but padding costs like tokens and attention grows
    with the square of the longest prompt. Measured on the default tiny GLM, one run vs one per
    prompt: 8 x 18 tokens 1.0 vs 2.0 ms, 8 x 64 3.4 vs 4.2 ms, 8 x 100 6.2 vs 6.1 ms,
    4 x 256 10.0 vs 8.1 ms, 20 + 200 tokens 3.4 vs 2.0 ms."""
    groups: list[list[int]] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        padded = (len(groups[-1]) + 1) * lengths[i] if groups else 0
        if (
            groups
            and padded <= PREFILL_MAX_PADDED_TOKENS
            and real + lengths[i] >= PREFILL_MIN_FILL * padded
        ):
            groups[-1].append(i)
            real += lengths[i]
        else:
            groups.append([i])
            real = lengths[i]
    return [sorted(group) for group in groups]
