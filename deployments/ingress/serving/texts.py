"""Embeddings and moderation for both APIs: admission, the cache (OpenAI API), the edge and the
model's handle; the key's tokens are settled in a `finally` however the request ends."""

from __future__ import annotations

from typing import Any, ClassVar

from deployments.contracts.embedding_deployment import EmbeddingClient, EmbedRequest
from deployments.contracts.encoder_outputs import EmbeddingResult
from deployments.contracts.moderation_deployment import ClassifyRequest, ModerationClient
from deployments.ingress.edge.calls import ModelCall
from deployments.ingress.protocol import (
    EmbeddingList,
    EmbeddingRequest,
    Moderation,
    ModerationCreateResponse,
    ModerationRequest,
    moderation_id,
)
from deployments.ingress.protocol.models import Task
from deployments.ingress.serving.admission import AdmittedTexts
from deployments.ingress.serving.answer import Answer
from deployments.ingress.serving.base import ModelService
from deployments.ingress.serving.context import RequestContext
from deployments.observability import RequestTelemetry


class TextService(ModelService):
    """A text task's services; subclasses name the task."""

    task: ClassVar[Task]

    async def _admit(
        self, model_name: str, texts: list[str], ctx: RequestContext, telemetry: RequestTelemetry
    ) -> AdmittedTexts:
        """The model (404, or 400 for another task; the key's fallback past its budget) and the
        key's reservation for the texts."""
        telemetry.request(task=self.task, model=model_name, prompt=texts)
        model = self.catalogue.get(model_name, self.task)
        return await self.admission.admit_texts(texts, model, ctx, telemetry)


class EmbeddingService(TextService):
    task = "embedding"

    async def create(
        self, body: EmbeddingRequest, ctx: RequestContext, telemetry: RequestTelemetry
    ) -> Answer[EmbeddingList]:
        """OpenAI's embeddings, cached; the replica checks `dimensions` before it runs the
        model."""
        model, quota, fallback = await self._admit(body.model, body.texts, ctx, telemetry)
        call = ModelCall(
            EmbeddingClient.embed, EmbedRequest(body.texts, ctx.traceparent, body.dimensions)
        )
        used_tokens = 0
        try:
            cached = await self.cached.lookup(self.task, body, ctx, cacheable=not fallback)
            if cached.hit is not None:
                embeddings, trace = cached.hit, await self.edge.nearest(model.name, ctx, telemetry)
            else:
                result, trace = await self.edge.dispatch(model.name, ctx, call, telemetry)
                vectors: EmbeddingResult = result.reply.value
                embeddings = EmbeddingList(
                    vectors.vectors, model.name, vectors.total_tokens, body.encoding_format
                )
                await cached.store(embeddings, trace)
            used_tokens = embeddings.prompt_tokens
        finally:
            quota.settle(used_tokens)
        telemetry.usage(input_tokens=embeddings.prompt_tokens)
        return Answer.of(embeddings, trace, quota)

    async def embed(
        self, model_name: str, texts: list[str], ctx: RequestContext, telemetry: RequestTelemetry
    ) -> Answer[EmbeddingResult]:
        """The vectors themselves, uncached (the Workers-AI API)."""
        model, quota, _ = await self._admit(model_name, texts, ctx, telemetry)
        call = ModelCall(EmbeddingClient.embed, EmbedRequest(texts, ctx.traceparent))
        used_tokens = 0
        try:
            result, trace = await self.edge.dispatch(model.name, ctx, call, telemetry)
            vectors: EmbeddingResult = result.reply.value
            used_tokens = vectors.total_tokens
        finally:
            quota.settle(used_tokens)
        telemetry.usage(input_tokens=vectors.total_tokens)
        return Answer.of(vectors, trace, quota)


class ModerationService(TextService):
    """The moderation model reports no token counts: a request is charged its estimate."""

    task = "moderation"

    async def create(
        self, body: ModerationRequest, ctx: RequestContext, telemetry: RequestTelemetry
    ) -> Answer[ModerationCreateResponse]:
        """OpenAI's moderations, cached."""
        model, quota, fallback = await self._admit(body.model, body.texts, ctx, telemetry)
        call = ModelCall(ModerationClient.classify, ClassifyRequest(body.texts, ctx.traceparent))
        used_tokens = 0
        try:
            cached = await self.cached.lookup(self.task, body, ctx, cacheable=not fallback)
            if cached.hit is not None:
                response, trace = cached.hit, await self.edge.nearest(model.name, ctx, telemetry)
            else:
                result, trace = await self.edge.dispatch(model.name, ctx, call, telemetry)
                response = ModerationCreateResponse(
                    id=moderation_id(), model=model.name, results=verdicts(result.reply.value)
                )
                await cached.store(response, trace)
            used_tokens = quota.reserved_tokens
        finally:
            quota.settle(used_tokens)
        _report_flags(response.results, telemetry)
        return Answer.of(response, trace, quota)

    async def classify(
        self, model_name: str, texts: list[str], ctx: RequestContext, telemetry: RequestTelemetry
    ) -> Answer[list[Moderation]]:
        """One verdict per text, uncached (the Workers-AI API)."""
        model, quota, _ = await self._admit(model_name, texts, ctx, telemetry)
        call = ModelCall(ModerationClient.classify, ClassifyRequest(texts, ctx.traceparent))
        used_tokens = 0
        try:
            result, trace = await self.edge.dispatch(model.name, ctx, call, telemetry)
            results = verdicts(result.reply.value)
            used_tokens = quota.reserved_tokens
        finally:
            quota.settle(used_tokens)
        _report_flags(results, telemetry)
        return Answer.of(results, trace, quota)


def verdicts(results: list[Any]) -> list[Moderation]:
    return [Moderation.from_scores(r.category_scores, r.categories) for r in results]


def _report_flags(results: list[Moderation], telemetry: RequestTelemetry) -> None:
    telemetry.flagged(name for result in results for name, on in result.categories.items() if on)
