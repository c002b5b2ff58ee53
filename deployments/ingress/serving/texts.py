"""Embeddings and moderation for both APIs, through the one model-service path
(`ModelService.serve`: admission, the cache for the OpenAI API, the edge and the model's handle,
the key's tokens settled however the request ends)."""

from __future__ import annotations

from typing import Any, TypeVar

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
from deployments.ingress.security import Reservation
from deployments.ingress.serving.admission import AdmittedTexts
from deployments.ingress.serving.answer import Answer
from deployments.ingress.serving.base import ModelService
from deployments.ingress.serving.context import RequestContext
from deployments.observability import RequestTelemetry

TextRequest = TypeVar("TextRequest", EmbeddingRequest, ModerationRequest)
TextAnswer = TypeVar("TextAnswer", EmbeddingList, ModerationCreateResponse)


class TextService(ModelService[TextRequest, AdmittedTexts, TextAnswer]):
    """A text task's services; subclasses name the task."""

    async def _admit(self, model_name: str, texts: list[str], ctx: RequestContext) -> AdmittedTexts:
        """The model (404, or 400 for another task; the key's fallback past its budget) and the
        key's reservation for the texts."""
        ctx.telemetry.request(task=self.task, model=model_name, prompt=texts)
        model = self.catalogue.get(model_name, self.task)
        return await self.admission.admit_texts(texts, model, ctx)


class EmbeddingService(TextService[EmbeddingRequest, EmbeddingList]):
    task = "embedding"

    async def create(self, body: EmbeddingRequest, ctx: RequestContext) -> Answer[EmbeddingList]:
        """OpenAI's embeddings, cached; the replica checks `dimensions` before it runs the
        model."""
        admitted = await self._admit(body.model, body.texts, ctx)
        call = ModelCall(
            EmbeddingClient.embed, EmbedRequest(body.texts, ctx.traceparent, body.dimensions)
        )
        return await self.serve(body, ctx, admitted, call, cacheable=True)

    async def embed(
        self, model_name: str, texts: list[str], ctx: RequestContext
    ) -> Answer[EmbeddingList]:
        """The vectors themselves, uncached (the Workers-AI API)."""
        admitted = await self._admit(model_name, texts, ctx)
        call = ModelCall(EmbeddingClient.embed, EmbedRequest(texts, ctx.traceparent))
        # already checked as the Workers AI input it came as: not validated a second time
        asked = EmbeddingRequest.model_construct(model=model_name, input=texts)
        return await self.serve(asked, ctx, admitted, call, cacheable=False)

    async def _answer(
        self,
        asked: EmbeddingRequest,
        admitted: AdmittedTexts,
        reply: EmbeddingResult,
        ctx: RequestContext,
    ) -> EmbeddingList:
        return EmbeddingList(
            reply.vectors, admitted.model.name, reply.total_tokens, asked.encoding_format
        )

    def _used_tokens(self, answer: EmbeddingList, quota: Reservation) -> int:
        return answer.prompt_tokens

    def _report_usage(self, answer: EmbeddingList, telemetry: RequestTelemetry) -> None:
        telemetry.usage(input_tokens=answer.prompt_tokens)


class ModerationService(TextService[ModerationRequest, ModerationCreateResponse]):
    """The moderation model reports no token counts: a request is charged its estimate."""

    task = "moderation"

    async def create(
        self, body: ModerationRequest, ctx: RequestContext
    ) -> Answer[ModerationCreateResponse]:
        """OpenAI's moderations, cached."""
        admitted = await self._admit(body.model, body.texts, ctx)
        call = ModelCall(ModerationClient.classify, ClassifyRequest(body.texts, ctx.traceparent))
        return await self.serve(body, ctx, admitted, call, cacheable=True)

    async def classify(
        self, model_name: str, texts: list[str], ctx: RequestContext
    ) -> Answer[ModerationCreateResponse]:
        """One verdict per text (`results`), uncached (the Workers-AI API)."""
        admitted = await self._admit(model_name, texts, ctx)
        call = ModelCall(ModerationClient.classify, ClassifyRequest(texts, ctx.traceparent))
        # already checked as the Workers AI input it came as: not validated a second time
        asked = ModerationRequest.model_construct(model=model_name, input=texts)
        return await self.serve(asked, ctx, admitted, call, cacheable=False)

    async def _answer(
        self,
        asked: ModerationRequest,
        admitted: AdmittedTexts,
        reply: list[Any],
        ctx: RequestContext,
    ) -> ModerationCreateResponse:
        return ModerationCreateResponse(
            id=moderation_id(), model=admitted.model.name, results=verdicts(reply)
        )

    def _used_tokens(self, answer: ModerationCreateResponse, quota: Reservation) -> int:
        return quota.reserved_tokens

    def _report_usage(self, answer: ModerationCreateResponse, telemetry: RequestTelemetry) -> None:
        flagged = (n for result in answer.results for n, on in result.categories.items() if on)
        telemetry.flagged(flagged)


def verdicts(results: list[Any]) -> list[Moderation]:
    return [Moderation.from_scores(r.category_scores, r.categories) for r in results]
