"""Embedding and moderation replicas: concurrent requests are merged into one forward pass with
`@serve.batch`; each request is validated alone first, so one bad input never fails a batch."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from ray import serve

from deployments.config import BatchingConfig
from deployments.errors import InvalidRequestError
from deployments.observability.model_telemetry import ModelCall
from deployments.runtime.embedding import EmbeddingRuntime
from deployments.runtime.encoder_outputs import EmbeddingResult, ModerationResult
from deployments.runtime.moderation import ModerationRuntime
from deployments.runtime.session_config import SessionConfig
from deployments.servers.base import ModelServer, Reply, RuntimeFactory, in_thread


def check_dimensions(requested: int | None, dimension: int, model: str) -> None:
    if requested is not None and requested != dimension:
        raise InvalidRequestError(
            f"{model!r} returns {dimension}-dimensional vectors; "
            f"dimensions={requested} is not available",
            param="dimensions",
        )


def _count_texts(batch: list[list[str]]) -> int:
    return sum(len(texts) for texts in batch)


class BatchedTextServer(ModelServer[Any]):
    """Texts in, one result per text out; `_infer` is the only model-specific part."""

    async def _submit(self, texts: list[str], call: ModelCall) -> list[Any]:
        rows, (started, seconds, batch_size) = await self._run_batch(texts)
        call.timings.forwarded(started, seconds, batch_size)
        return rows

    # The batch size counts texts, not requests, so a 32-text request fills a batch of 32.
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005, batch_size_fn=_count_texts)
    async def _run_batch(
        self, batch: list[list[str]]
    ) -> list[tuple[list[Any], tuple[float, float, int]]]:
        flat = [text for texts in batch for text in texts]
        started = time.perf_counter()
        results = await in_thread(self._infer, flat)
        run = (started, time.perf_counter() - started, len(flat))
        out, start = [], 0
        for texts in batch:
            out.append((results[start : start + len(texts)], run))
            start += len(texts)
        return out

    def _apply_batching(self, batching: BatchingConfig) -> None:
        self._run_batch.set_max_batch_size(batching.max_batch_size)  # type: ignore[attr-defined]
        self._run_batch.set_batch_wait_timeout_s(batching.batch_wait_timeout_s)  # type: ignore[attr-defined]

    def _infer(self, texts: list[str]) -> Sequence[Any]:
        raise NotImplementedError


class EmbeddingServer(BatchedTextServer):
    TASK = "embedding"

    def __init__(
        self,
        model_dir: str,
        session: SessionConfig,
        runtime_factory: RuntimeFactory = EmbeddingRuntime,
        observability: dict[str, Any] | None = None,
        model_name: str | None = None,
        region: str | None = None,
        control: Any = None,
    ):
        super().__init__(
            model_dir, session, runtime_factory, observability, model_name, region, control
        )

    async def embed(
        self, texts: list[str], traceparent: str | None = None, dimensions: int | None = None
    ) -> Reply[EmbeddingResult]:
        """`dimensions`, when the client asked for one, must be the model's: checked with the
        request, before any inference runs."""
        await self.faults.check()
        self.runtime.check(texts)
        check_dimensions(dimensions, self.runtime.dimension, self.model_name)
        with self.observability.call(traceparent) as call:
            result = EmbeddingResult.concat(await self._submit(texts, call))
            call.usage(input_tokens=result.total_tokens)
        return self.reply(result)

    def _infer(self, texts: list[str]) -> list[EmbeddingResult]:
        return self.runtime.embed(texts).split()


class ModerationServer(BatchedTextServer):
    TASK = "moderation"

    def __init__(
        self,
        model_dir: str,
        session: SessionConfig,
        runtime_factory: RuntimeFactory = ModerationRuntime,
        observability: dict[str, Any] | None = None,
        model_name: str | None = None,
        region: str | None = None,
        control: Any = None,
    ):
        super().__init__(
            model_dir, session, runtime_factory, observability, model_name, region, control
        )

    async def classify(
        self, texts: list[str], traceparent: str | None = None
    ) -> Reply[list[ModerationResult]]:
        await self.faults.check()
        self.runtime.check(texts)
        with self.observability.call(traceparent) as call:
            results = await self._submit(texts, call)
        return self.reply(results)

    def _infer(self, texts: list[str]) -> list[ModerationResult]:
        return self.runtime.classify(texts)
