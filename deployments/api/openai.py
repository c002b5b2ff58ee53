"""The OpenAI-compatible API: /v1/models, /v1/chat/completions, /v1/embeddings, /v1/moderations."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime,
# and `Authenticated` is local to the router factory.
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Depends, Response

from deployments.api.caller import Caller, caller_of
from deployments.api.errors import openai_error_body
from deployments.api.responses import json_response
from deployments.api.streaming import event_stream
from deployments.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceDelta,
    ChunkChoice,
    CreateEmbeddingResponse,
    EmbeddingRequest,
    ModelList,
    ModerationCreateResponse,
    ModerationRequest,
    Usage,
    chat_completion_id,
    created_timestamp,
)
from deployments.runtime.llm import GenerationChunk
from deployments.serving.services import RouterServices


def openai_routes(services: RouterServices) -> APIRouter:
    routes = APIRouter()
    Authenticated = Annotated[Caller, Depends(caller_of(services.keys))]

    # response_model documents the body in /openapi.json; the answers are returned as responses,
    # so FastAPI does not validate them a second time.
    @routes.get("/v1/models", response_model=ModelList)
    async def list_models(caller: Authenticated) -> Response:
        return json_response(services.catalogue.cards())

    @routes.post("/v1/chat/completions", response_model=ChatCompletion)
    async def chat_completions(body: ChatCompletionRequest, caller: Authenticated) -> Response:
        if body.stream:
            stream = await services.chat.stream(body, caller.context, caller.telemetry)
            events = openai_chunks(body, stream.value)
            return event_stream(events, openai_error_body, stream.headers)
        answer = await services.chat.complete(body, caller.context, caller.telemetry)
        return json_response(answer.value, answer.headers)

    @routes.post("/v1/embeddings", response_model=CreateEmbeddingResponse)
    async def embeddings(body: EmbeddingRequest, caller: Authenticated) -> Response:
        answer = await services.embeddings.create(body, caller.context, caller.telemetry)
        return json_response(answer.value, answer.headers)

    @routes.post("/v1/moderations", response_model=ModerationCreateResponse)
    async def moderations(body: ModerationRequest, caller: Authenticated) -> Response:
        answer = await services.moderations.create(body, caller.context, caller.telemetry)
        return json_response(answer.value, answer.headers)

    return routes


async def openai_chunks(
    chat: ChatCompletionRequest, chunks: AsyncIterator[GenerationChunk]
) -> AsyncIterator[str]:
    """`chat.completion.chunk` events: the assistant role first, then the text, then the usage
    if the client asked for it."""
    chunk_id, created = chat_completion_id(), created_timestamp()

    def event(choices: list[ChunkChoice], usage: Usage | None = None) -> str:
        return ChatCompletionChunk(
            id=chunk_id, created=created, model=chat.model, choices=choices, usage=usage
        ).model_dump_json()

    yield event([ChunkChoice(index=0, delta=ChoiceDelta(role="assistant", content=""))])
    last: GenerationChunk | None = None
    async for chunk in chunks:
        last = chunk
        delta = ChoiceDelta(content=chunk.text)
        yield event([ChunkChoice(index=0, delta=delta, finish_reason=chunk.finish_reason)])
    if chat.include_usage and last is not None:
        yield event([], Usage.from_counts(last.prompt_tokens, last.completion_tokens))
