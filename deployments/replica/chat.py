"""The chat replica (GLM and Kimi alike: they differ only by model directory and template)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deployments.config import MIB, BatchingConfig
from deployments.contracts.chat_deployment import ChatRequest
from deployments.contracts.chat_features import ChatFeatures
from deployments.contracts.outputs import Completion, GenerationChunk
from deployments.contracts.replies import Reply
from deployments.contracts.sampling_params import GenerationOptions, SamplingParams
from deployments.observability.model_telemetry import ModelCall
from deployments.replica.base import ModelServer
from deployments.replica.engine.chat_features import (
    grammar_of,
    stream_with_tool_calls,
    with_tool_calls,
)
from deployments.replica.engine.llm import LLMRuntime
from deployments.replica.engine.tool_calls import ToolCallFormat, tool_call_format

if TYPE_CHECKING:
    pass


class ChatServer(ModelServer[LLMRuntime]):
    """deployments.contracts.chat_deployment.ChatServerProtocol: each method takes its one
    ChatRequest."""

    TASK = "chat"
    RUNTIME = LLMRuntime

    def _apply_batching(self, batching: BatchingConfig) -> None:
        # First, as it may be refused: then nothing of the new config applies.
        budget_mb = batching.kv_budget_mb
        self.runtime.set_kv_budget(None if budget_mb is None else int(budget_mb * MIB))
        # The engine reads the limit before each step: new sequences wait for a free slot.
        self.runtime.max_batch_size = batching.max_batch_size
        self.runtime.prefix_cache.resize(int(batching.prefix_cache_mb * MIB))
        # Read at each newcomer's prefill: it applies from the next one.
        self.runtime.runner.prefill_chunk_tokens = batching.prefill_chunk_tokens
        self.runtime.runner.pacer.step_share = batching.prefill_step_share
        self._report_kv_cache()

    def _report_kv_cache(self) -> None:
        """The KV cache's bytes and budget and the preemptions since the last report, as
        metrics (after each call and each config change)."""
        metrics = self.observability.metrics
        if metrics is not None:
            usage = self.runtime.kv_usage()
            preemptions = usage["preemptions"] or 0
            metrics.kv_cache(usage["bytes"] or 0, usage["budget_bytes"], preemptions)

    @property
    def tool_format(self) -> ToolCallFormat:
        return tool_call_format(
            self.runtime.manifest.family, list(self.runtime.tokenizer.special_tokens)
        )

    @staticmethod
    def _prompt(
        messages: Sequence[Mapping[str, Any]], features: ChatFeatures
    ) -> Sequence[Mapping[str, Any]] | str:
        return str(messages[-1]["content"]) if features.raw else messages

    def _options(self, features: ChatFeatures) -> GenerationOptions:
        fmt = self.tool_format
        return GenerationOptions(
            n=features.n,
            tools=features.tools,
            grammar=grammar_of(features, fmt),
            keep_special_tokens=features.parses_tool_calls and fmt.keeps_special_tokens,
        )

    async def complete(self, request: ChatRequest) -> Reply[Completion]:
        """The first choice; `complete_choices` for all n."""
        reply = await self.complete_choices(request)
        return self.reply(reply.value[0])

    async def complete_choices(self, request: ChatRequest) -> Reply[list[Completion]]:
        await self.faults.check()
        params, features = request.params, request.features
        with self._call(request.traceparent, params, stream=False) as call:
            choices = await self.runtime.complete_choices(
                self._prompt(request.messages, features),
                params,
                self._options(features),
                timings=call.timings,
            )
            choices = [with_tool_calls(c, self.tool_format, features) for c in choices]
            call.usage(
                input_tokens=choices[0].prompt_tokens,
                output_tokens=sum(c.completion_tokens for c in choices),
                finish_reason=choices[0].finish_reason,
                cached_input_tokens=choices[0].cached_tokens,
            )
        self._report_kv_cache()
        return self.reply(choices)

    async def stream(self, request: ChatRequest) -> AsyncIterator[Reply[GenerationChunk]]:
        await self.faults.check()
        params, features = request.params, request.features
        with self._call(request.traceparent, params, stream=True) as call:
            chunks = self.runtime.stream(
                self._prompt(request.messages, features),
                params,
                self._options(features),
                timings=call.timings,
            )
            # With n > 1, each chunk reports the tokens of all choices so far: what the caller
            # meters and reports as usage.
            generated: dict[int, int] = {}
            async for chunk in stream_with_tool_calls(chunks, self.tool_format, features):
                generated[chunk.index] = chunk.completion_tokens
                chunk = dataclasses.replace(chunk, completion_tokens=sum(generated.values()))
                if chunk.finish_reason is not None:
                    call.usage(
                        input_tokens=chunk.prompt_tokens,
                        output_tokens=chunk.completion_tokens,
                        finish_reason=chunk.finish_reason,
                        cached_input_tokens=chunk.cached_tokens,
                    )
                    self._report_kv_cache()
                yield self.reply(chunk)

    def _call(self, traceparent: str | None, params: SamplingParams, stream: bool) -> ModelCall:
        return self.observability.call(
            traceparent,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed,
            stream=stream,
        )
