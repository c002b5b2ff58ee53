"""Embedding and moderation replicas: concurrent requests are merged into one forward pass with
`@serve.batch`; each request is validated alone first, so one bad input never fails a batch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ray import serve

from deployments.config import BatchingConfig
from deployments.runtime.embedding import EmbeddingResult, EmbeddingRuntime
from deployments.runtime.moderation import ModerationResult, ModerationRuntime
from deployments.runtime.session import SessionConfig
from deployments.servers.base import ModelServer, Reply, RuntimeFactory, in_thread


def _count_texts(batch: list[list[str]]) -> int:
    return sum(len(texts) for texts in batch)


class BatchedTextServer(ModelServer[Any]):
    """Texts in, one result per text out; `_infer` is the only model-specific part."""

    async def _submit(self, texts: list[str]) -> list[Any]:
        return await self._run_batch(texts)

    # The batch size counts texts, not requests, so a 32-text request fills a batch of 32.
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005, batch_size_fn=_count_texts)
    async def _run_batch(self, batch: list[list[str]]) -> list[list[Any]]:
        flat = [text for texts in batch for text in texts]
        results = await in_thread(self._infer, flat)
        out, start = [], 0
        for texts in batch:
            out.append(results[start : start + len(texts)])
            start += len(texts)
        return out

    def _apply_batching(self, batching: BatchingConfig) -> None:
        self._run_batch.set_max_batch_size(batching.max_batch_size)  # type: ignore[attr-defined]
        self._run_batch.set_batch_wait_timeout_s(batching.batch_wait_timeout_s)  # type: ignore[attr-defined]

    def _infer(self, texts: list[str]) -> Sequence[Any]:
        raise NotImplementedError


class EmbeddingServer(BatchedTextServer):
    def __init__(
        self,
        model_dir: str,
        session: SessionConfig,
        runtime_factory: RuntimeFactory = EmbeddingRuntime,
    ):
        super().__init__(model_dir, session, runtime_factory)

    async def embed(self, texts: list[str]) -> Reply[EmbeddingResult]:
        self.runtime.check(texts)
        rows = await self._submit(texts)
        return self.reply(EmbeddingResult.concat(rows))

    def _infer(self, texts: list[str]) -> list[EmbeddingResult]:
        return self.runtime.embed(texts).split()


class ModerationServer(BatchedTextServer):
    def __init__(
        self,
        model_dir: str,
        session: SessionConfig,
        runtime_factory: RuntimeFactory = ModerationRuntime,
    ):
        super().__init__(model_dir, session, runtime_factory)

    async def classify(self, texts: list[str]) -> Reply[list[ModerationResult]]:
        self.runtime.check(texts)
        return self.reply(await self._submit(texts))

    def _infer(self, texts: list[str]) -> list[ModerationResult]:
        return self.runtime.classify(texts)
