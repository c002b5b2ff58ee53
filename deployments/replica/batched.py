"""Embedding and moderation replicas: concurrent requests are merged into one forward pass with
`@serve.batch`; each request is validated alone first, so one bad input never fails a batch. A
router sends requests that came together as one call (`embed_many`, `classify_many`: one entry of
the batch, each request still its own span, result and error), and the replica reports every
request it holds to the autoscaler, however many calls carried them. A request is tokenized once:
what its validation encoded is what the batch embeds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from ray import serve

from deployments.config import BatchingConfig
from deployments.contracts.autoscaling import REQUESTS_METRIC
from deployments.contracts.embedding_deployment import EmbedRequest
from deployments.contracts.encoder_outputs import EmbeddingResult, ModerationResult
from deployments.contracts.model_deployment import GroupedReplies
from deployments.contracts.moderation_deployment import ClassifyRequest
from deployments.contracts.replies import Reply
from deployments.errors import InvalidRequestError, ServingError
from deployments.observability.model_telemetry import ModelCall
from deployments.replica.base import ModelServer, in_thread
from deployments.replica.engine.embedding import EmbeddingRuntime
from deployments.replica.engine.moderation import ModerationRuntime

if TYPE_CHECKING:
    pass


def check_dimensions(requested: int | None, dimension: int, model: str) -> None:
    if requested is not None and requested != dimension:
        raise InvalidRequestError(
            f"{model!r} returns {dimension}-dimensional vectors; "
            f"dimensions={requested} is not available",
            param="dimensions",
        )


RequestT = TypeVar("RequestT")
T = TypeVar("T")


def _count_texts(batch: list[list[Any]]) -> int:
    return sum(len(texts) for texts in batch)


class BatchedTextServer(ModelServer[Any]):
    """Texts in, one result per text out; `_infer` (the batch's results) and `_rows` (one
    request's share of them) are the only model-specific parts. A batch entry is one request's
    texts as the model takes them (the embedding model: their tokens)."""

    requests_in_replica = 0

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Ray Serve asks every metrics interval; a grouped call counts as its requests."""
        return {REQUESTS_METRIC: float(self.requests_in_replica)}

    async def _submit(self, texts: list[Any], call: ModelCall) -> Any:
        rows, (started, seconds, batch_size) = await self._run_batch(texts)
        call.timings.forwarded(started, seconds, batch_size)
        return rows

    # The batch size counts texts, not requests, so a 32-text request fills a batch of 32.
    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.005, batch_size_fn=_count_texts)
    async def _run_batch(
        self, batch: list[list[Any]]
    ) -> list[tuple[Any, tuple[float, float, int]]]:
        flat = [text for texts in batch for text in texts]
        started = time.perf_counter()
        results = await in_thread(self._infer, flat)
        run = (started, time.perf_counter() - started, len(flat))
        out, start = [], 0
        for texts in batch:
            out.append((self._rows(results, start, start + len(texts)), run))
            start += len(texts)
        return out

    async def _many(
        self,
        requests: list[RequestT],
        one: Callable[[RequestT], Awaitable[Reply[T]]],
    ) -> GroupedReplies[T]:
        """Each request of a grouped call through `one`, all at once, so they share the batch;
        a request's own error is its answer, not the call's."""

        async def answer(request: RequestT) -> Reply[T] | ServingError:
            try:
                return await one(request)
            except ServingError as error:
                return error

        return list(await asyncio.gather(*(answer(request) for request in requests)))

    @contextlib.contextmanager
    def _held(self, requests: int) -> Iterator[None]:
        self.requests_in_replica += requests
        try:
            yield
        finally:
            self.requests_in_replica -= requests

    def _apply_batching(self, batching: BatchingConfig) -> None:
        self._run_batch.set_max_batch_size(batching.max_batch_size)  # type: ignore[attr-defined]
        self._run_batch.set_batch_wait_timeout_s(batching.batch_wait_timeout_s)  # type: ignore[attr-defined]

    def _infer(self, texts: list[Any]) -> Any:
        raise NotImplementedError

    def _rows(self, results: Any, start: int, stop: int) -> Any:
        return results[start:stop]


class EmbeddingServer(BatchedTextServer):
    """deployments.contracts.embedding_deployment.EmbeddingServerProtocol."""

    TASK = "embedding"
    RUNTIME = EmbeddingRuntime

    async def embed(self, request: EmbedRequest) -> Reply[EmbeddingResult]:
        with self._held(1):
            return await self._embed(request)

    async def embed_many(self, requests: list[EmbedRequest]) -> GroupedReplies[EmbeddingResult]:
        """Each request as `embed` answers it, in order (deployments.ingress.edge.coalesce)."""
        with self._held(len(requests)):
            return await self._many(requests, self._embed)

    async def _embed(self, request: EmbedRequest) -> Reply[EmbeddingResult]:
        """`dimensions`, when the client asked for one, must be the model's: checked with the
        request, before any inference runs. The texts are tokenized here, once: validating
        them needs their tokens (over-long input), and the batch embeds those tokens."""
        await self.faults.check()
        tokens = self.runtime.tokenize(request.texts)
        check_dimensions(request.dimensions, self.runtime.dimension, self.model_name)
        with self.observability.call(request.traceparent) as call:
            result: EmbeddingResult = await self._submit(tokens, call)
            call.usage(input_tokens=result.total_tokens)
        return self.reply(result)

    def _infer(self, texts: list[Any]) -> EmbeddingResult:
        return self.runtime.embed_tokens(texts)

    def _rows(self, results: EmbeddingResult, start: int, stop: int) -> EmbeddingResult:
        return results.rows(start, stop)


class ModerationServer(BatchedTextServer):
    """deployments.contracts.moderation_deployment.ModerationServerProtocol."""

    TASK = "moderation"
    RUNTIME = ModerationRuntime

    async def classify(self, request: ClassifyRequest) -> Reply[list[ModerationResult]]:
        with self._held(1):
            return await self._classify(request)

    async def classify_many(
        self, requests: list[ClassifyRequest]
    ) -> GroupedReplies[list[ModerationResult]]:
        """Each request as `classify` answers it, in order (deployments.ingress.edge.coalesce)."""
        with self._held(len(requests)):
            return await self._many(requests, self._classify)

    async def _classify(self, request: ClassifyRequest) -> Reply[list[ModerationResult]]:
        await self.faults.check()
        self.runtime.check(request.texts)
        with self.observability.call(request.traceparent) as call:
            results: list[ModerationResult] = await self._submit(request.texts, call)
        return self.reply(results)

    def _infer(self, texts: list[str]) -> list[ModerationResult]:
        return self.runtime.classify(texts)
