"""The chat replica (GLM and Kimi alike: they differ only by model directory and template)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from deployments.config import BatchingConfig
from deployments.observability.model_telemetry import ModelCall
from deployments.runtime.llm import Completion, GenerationChunk, LLMRuntime
from deployments.runtime.sampling import SamplingParams
from deployments.runtime.session import SessionConfig
from deployments.servers.base import ModelServer, Reply, RuntimeFactory


class ChatServer(ModelServer[LLMRuntime]):
    TASK = "chat"

    def __init__(
        self,
        model_dir: str,
        session: SessionConfig,
        runtime_factory: RuntimeFactory = LLMRuntime,
        observability: dict[str, Any] | None = None,
        model_name: str | None = None,
        region: str | None = None,
        control: Any = None,
    ):
        super().__init__(
            model_dir, session, runtime_factory, observability, model_name, region, control
        )

    def _apply_batching(self, batching: BatchingConfig) -> None:
        # The engine reads the limit before each step: new sequences wait for a free slot.
        self.runtime.max_batch_size = batching.max_batch_size

    async def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: SamplingParams,
        traceparent: str | None = None,
    ) -> Reply[Completion]:
        await self.faults.check()
        with self._call(traceparent, params, stream=False) as call:
            done = await self.runtime.complete(messages, params, timings=call.timings)
            call.usage(
                input_tokens=done.prompt_tokens,
                output_tokens=done.completion_tokens,
                finish_reason=done.finish_reason,
            )
        return self.reply(done)

    async def stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        params: SamplingParams,
        traceparent: str | None = None,
    ) -> AsyncIterator[Reply[GenerationChunk]]:
        await self.faults.check()
        with self._call(traceparent, params, stream=True) as call:
            async for chunk in self.runtime.stream(messages, params, timings=call.timings):
                if chunk.finish_reason is not None:
                    call.usage(
                        input_tokens=chunk.prompt_tokens,
                        output_tokens=chunk.completion_tokens,
                        finish_reason=chunk.finish_reason,
                    )
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
