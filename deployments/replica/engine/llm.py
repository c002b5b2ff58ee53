"""Chat generation on a KV-cache decoder graph, with continuous batching of concurrent requests:
the request API, what a caller (`replica/chat.py`) sees.

Each request becomes a sequence per choice. The `scheduler` admits waiting sequences and the
step runner prefills them and advances every running sequence by one token in a single batched
forward pass, so concurrent streams share each step; sequences join and leave between steps. The
manifest picks the runner: `step_runner` for the plain graph, `slot_step_runner` for a slot-cache
graph (`kv_cache.layout == "slots"`, which has no prefix cache yet). A KV budget (`kv_budget`)
bounds what their caches hold: the scheduler admits and preempts against it.
What a generation is asked is in `sampling_params`, what it returns in `outputs`, one
sequence's state in `sequence`, where the engine's time goes in `step_profile`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
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
from deployments.errors import ContextLengthExceededError, InvalidRequestError, ServingError
from deployments.observability.timings import InferenceTimings
from deployments.replica.engine.allocator import keep_freed_memory
from deployments.replica.engine.decoder import DecoderGraph
from deployments.replica.engine.grammar import GrammarCompiler
from deployments.replica.engine.kv_budget import KVBudget
from deployments.replica.engine.prefix_cache import DEFAULT_MAX_BYTES as PREFIX_CACHE_BYTES
from deployments.replica.engine.prefix_cache import PrefixCache
from deployments.replica.engine.sampling import SamplingState, log_softmax
from deployments.replica.engine.scheduler import Scheduler
from deployments.replica.engine.sequence import SequenceState, coalesced
from deployments.replica.engine.session import SessionConfig
from deployments.replica.engine.slot_step_runner import PREFIX_CACHE_OFF, SlotStepRunner
from deployments.replica.engine.step_profile import StepProfile
from deployments.replica.engine.step_runner import (
    DEFAULT_PREFILL_CHUNK_TOKENS,
    DecoderStepRunner,
    EngineThread,
)
from deployments.replica.engine.tokenizer import ChatTokenizer

DEFAULT_MAX_CHOICES = 8


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
        prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK_TOKENS,
        kv_budget_bytes: int | None = None,
    ):
        """`prefill_chunk_tokens`: long prompts are prefilled in chunks of this many tokens,
        the running streams decoding between two (`step_runner`, `slot_step_runner`).
        `kv_budget_bytes`: see `set_kv_budget`; None: no limit."""
        if max_batch_size < 1:  # before the model loads
            raise ValueError("max_batch_size must be at least 1")
        keep_freed_memory()  # a decode step's temporaries are reused, not re-mapped, each step
        self.model_dir = Path(model_dir)
        self.manifest = ModelManifest.load(self.model_dir)
        if self.manifest.task != "chat" or self.manifest.llm is None:
            raise ValueError(f"{model_dir} holds a {self.manifest.task} model, not a chat model")
        spec = self.manifest.llm
        self.context_length = spec.context_length
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
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.runner: EngineThread
        if spec.kv_cache.layout == "slots":
            self.runner = SlotStepRunner.open(
                self.model_dir,
                self.manifest,
                session_config,
                slots=max_batch_size,
                prefill_chunk_tokens=prefill_chunk_tokens,
            )
        else:
            self.runner = DecoderStepRunner.open(
                self.model_dir,
                self.manifest,
                session_config,
                self.prefix_cache,
                prefill_chunk_tokens,
            )
        self.session = self.runner.session
        self.kv_budget = KVBudget()
        if isinstance(self.runner, DecoderStepRunner):
            self.runner.budget = self.kv_budget  # the prefix cache gets what sequences leave
        self.scheduler: Scheduler[SequenceState] = Scheduler(
            self.runner, max_batch_size, self.kv_budget
        )
        self.set_kv_budget(kv_budget_bytes)

    def set_kv_budget(self, limit_bytes: int | None) -> None:
        """At most this many bytes of KV cache (the prefix cache's included); None: no limit.
        Refused (ValueError, with the numbers) beyond the host's memory or below one sequence
        of the model's whole context. Applies from the next admission: a lower limit preempts
        the newest running sequences until the rest fit."""
        longest = self.runner.kv_footprint(1, self.context_length)
        self.kv_budget.set_limit(
            limit_bytes, longest_sequence_bytes=longest, context_length=self.context_length
        )
        if limit_bytes is not None and isinstance(self.runner, SlotStepRunner):
            self.runner.budget(idle=self.scheduler.idle)

    def kv_usage(self) -> dict[str, int | None]:
        """The KV cache's bytes now, its budget (None: none) and the preemptions so far."""
        return {
            "bytes": self.runner.kv_bytes_in_use,
            "budget_bytes": self.kv_budget.limit_bytes,
            "preemptions": self.kv_budget.preemptions,
        }

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
        self.scheduler.submit(choices)
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
            self.scheduler.cancel(choices)  # a consumer that stops early frees its batch slots

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
        return await self.runner.in_thread(functools.partial(self._score_prompt, prompt, top))

    def _score_prompt(self, prompt: Sequence[int], top: int) -> tuple[PromptTokenLogprob, ...]:
        rows: Sequence[np.ndarray] | np.ndarray = []
        if len(prompt) > 1:
            rows = self.runner.cached_logits(prompt[:1], prompt[1:-1])
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
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
            "engine": dict(vars(self.runner.profile)),  # summed steps (benchmarks.at_size)
            "kv_cache": self.kv_usage(),
            "prefix_cache": (
                self.prefix_cache.describe()
                if isinstance(self.runner, DecoderStepRunner)
                else {"enabled": False, "why": PREFIX_CACHE_OFF}
            ),
        }

    @property
    def graph(self) -> DecoderGraph:
        """The plain graph (benchmarks and parity checks run it directly)."""
        if not isinstance(self.runner, DecoderStepRunner):
            raise ValueError(f"{self.model_dir} is a slot-cache model: it runs on SlotDecoder")
        return self.runner.graph

    # ---- counters the benchmarks and tests read and reset ------------------------------

    @property
    def max_batch_size(self) -> int:
        return self.scheduler.max_batch_size

    @max_batch_size.setter
    def max_batch_size(self, size: int) -> None:
        self.scheduler.max_batch_size = size

    @property
    def steps(self) -> int:
        return self.runner.steps

    @steps.setter
    def steps(self, steps: int) -> None:
        self.runner.steps = steps

    @property
    def max_batch_seen(self) -> int:
        return self.runner.max_batch_seen

    @max_batch_seen.setter
    def max_batch_seen(self, size: int) -> None:
        self.runner.max_batch_seen = size

    @property
    def profile(self) -> StepProfile:
        return self.runner.profile

    @profile.setter
    def profile(self, profile: StepProfile) -> None:
        self.runner.profile = profile

    def close(self) -> None:
        self.runner.close()
