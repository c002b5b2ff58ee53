"""The chat replica (GLM and Kimi alike: they differ only by model directory and template)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from deployments.config import BatchingConfig
from deployments.runtime.llm import Completion, GenerationChunk, LLMRuntime
from deployments.runtime.sampling import SamplingParams
from deployments.runtime.session import SessionConfig
from deployments.servers.base import ModelServer, Reply, RuntimeFactory


class ChatServer(ModelServer[LLMRuntime]):
    def __init__(
        self,
        model_dir: str,
        session: SessionConfig,
        runtime_factory: RuntimeFactory = LLMRuntime,
    ):
        super().__init__(model_dir, session, runtime_factory)

    def _apply_batching(self, batching: BatchingConfig) -> None:
        # The engine reads the limit before each step: new sequences wait for a free slot.
        self.runtime.max_batch_size = batching.max_batch_size

    async def complete(
        self, messages: Sequence[Mapping[str, Any]], params: SamplingParams
    ) -> Reply[Completion]:
        return self.reply(await self.runtime.complete(messages, params))

    async def stream(
        self, messages: Sequence[Mapping[str, Any]], params: SamplingParams
    ) -> AsyncIterator[Reply[GenerationChunk]]:
        async for chunk in self.runtime.stream(messages, params):
            yield self.reply(chunk)
