"""Embeddings and moderation for both APIs: admission, the cache (OpenAI API), the edge and the
model's handle; the key's tokens are settled in a `finally` however the request ends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

from deployments.edge import EdgeTrace
from deployments.observability import RequestTelemetry
from deployments.protocol import (
    EmbeddingList,
    EmbeddingRequest,
    Moderation,
    ModerationCreateResponse,
    ModerationRequest,
    moderation_id,
)
from deployments.protocol.models import Task
from deployments.runtime.encoder_outputs import EmbeddingResult
from deployments.servers.base import Reply
from deployments.serving.answer import Answer
from deployments.serving.base import ModelService
from deployments.serving.context import RequestContext
from deployments.serving.models import ServedModel

T = TypeVar("T")
# A model call on the deployment handle of the region the edge picked: (handle, texts, request).
ModelCall = Callable[[Any, list[str], RequestContext], Awaitable[Reply[Any]]]


class TextService(ModelService):
    """One text task's request path; subclasses name the task and how to call and count it."""

    task: ClassVar[Task]

    async def _serve(
        self,
        model_name: str,
        texts: list[str],
        ctx: RequestContext,
        telemetry: RequestTelemetry,
        call: ModelCall,
        shape: Callable[[ServedModel, Any], T],
        tokens_of: Callable[[T], int | None],
        cache_request: BaseModel | None = None,
    ) -> Answer[T]:
        """`shape` makes the answer of the model's reply; `tokens_of` counts what it used (None:
        the model does not count, the estimate stands); `cache_request`, if given, keys the
        cache."""
        telemetry.request(task=self.task, model=model_name, prompt=texts)
        model = self.catalogue.get(model_name, self.task)
        quota = self.admission.admit_texts(texts, ctx.principal)
        used_tokens = 0
        try:

            async def make() -> tuple[T, EdgeTrace]:
                reply, trace = await self.edge.call(
                    model.name, ctx, telemetry, lambda handle: call(handle, texts, ctx)
                )
                return shape(model, reply.value), trace

            if cache_request is None:
                answer, trace = await make()
            else:
                answer, trace = await self.cached.get_or_make(
                    self.task, model.name, cache_request, ctx, telemetry, make
                )
            counted = tokens_of(answer)
            used_tokens = quota.reserved_tokens if counted is None else counted
        finally:
            quota.settle(used_tokens)
        return Answer.of(answer, trace, quota)


class EmbeddingService(TextService):
    task = "embedding"

    async def create(
        self, body: EmbeddingRequest, ctx: RequestContext, telemetry: RequestTelemetry
    ) -> Answer[EmbeddingList]:
        """OpenAI's embeddings; the replica checks `dimensions` before it runs the model."""

        def shape(model: ServedModel, result: EmbeddingResult) -> EmbeddingList:
            return EmbeddingList(
                result.vectors, model.name, result.total_tokens, body.encoding_format
            )

        answer = await self._serve(
            body.model,
            body.texts,
            ctx,
            telemetry,
            lambda handle, texts, ctx: handle.embed.remote(texts, ctx.traceparent, body.dimensions),
            shape,
            lambda response: response.prompt_tokens,
            cache_request=body,
        )
        telemetry.usage(input_tokens=answer.value.prompt_tokens)
        return answer

    async def embed(
        self, model: str, texts: list[str], ctx: RequestContext, telemetry: RequestTelemetry
    ) -> Answer[EmbeddingResult]:
        """The vectors themselves, uncached (the Workers-AI API)."""
        answer = await self._serve(
            model,
            texts,
            ctx,
            telemetry,
            lambda handle, texts, ctx: handle.embed.remote(texts, ctx.traceparent),
            lambda model, result: result,
            lambda result: result.total_tokens,
        )
        telemetry.usage(input_tokens=answer.value.total_tokens)
        return answer


class ModerationService(TextService):
    task = "moderation"

    async def create(
        self, body: ModerationRequest, ctx: RequestContext, telemetry: RequestTelemetry
    ) -> Answer[ModerationCreateResponse]:
        """OpenAI's moderations, cached."""

        def shape(model: ServedModel, results: list[Any]) -> ModerationCreateResponse:
            return ModerationCreateResponse(
                id=moderation_id(), model=model.name, results=verdicts(results)
            )

        answer = await self._serve(
            body.model,
            body.texts,
            ctx,
            telemetry,
            _classify,
            shape,
            _uncounted,
            cache_request=body,
        )
        _report_flags(answer.value.results, telemetry)
        return answer

    async def classify(
        self, model: str, texts: list[str], ctx: RequestContext, telemetry: RequestTelemetry
    ) -> Answer[list[Moderation]]:
        """One verdict per text, uncached (the Workers-AI API)."""
        answer = await self._serve(
            model,
            texts,
            ctx,
            telemetry,
            _classify,
            lambda model, results: verdicts(results),
            _uncounted,
        )
        _report_flags(answer.value, telemetry)
        return answer


def verdicts(results: list[Any]) -> list[Moderation]:
    return [Moderation.from_scores(r.category_scores, r.categories) for r in results]


def _classify(handle: Any, texts: list[str], ctx: RequestContext) -> Awaitable[Reply[Any]]:
    return handle.classify.remote(texts, ctx.traceparent)  # type: ignore[no-any-return]


def _uncounted(answer: Any) -> None:
    """The moderation model reports no token counts: the request is charged its estimate."""
    return None


def _report_flags(results: list[Moderation], telemetry: RequestTelemetry) -> None:
    telemetry.flagged(name for result in results for name, on in result.categories.items() if on)
