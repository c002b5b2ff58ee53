"""The OpenAI-compatible API: /v1/models (list and retrieve), /v1/chat/completions,
/v1/completions (legacy), /v1/embeddings, /v1/moderations."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime,
# and `Authenticated` is local to the router factory.
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response

from deployments.api.caller import Caller, caller_of
from deployments.api.errors import openai_error_body
from deployments.api.responses import ignored_fields_header, json_response
from deployments.api.streaming import event_stream
from deployments.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceLogprobs,
    ChunkChoice,
    CreateEmbeddingResponse,
    EmbeddingRequest,
    ModelCard,
    ModelList,
    ModerationCreateResponse,
    ModerationRequest,
    Usage,
    chat_completion_id,
    created_timestamp,
)
from deployments.protocol.completions import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    completion_id,
)
from deployments.runtime.outputs import GenerationChunk
from deployments.serving.services import RouterServices


def openai_routes(services: RouterServices) -> APIRouter:
    routes = APIRouter()
    Authenticated = Annotated[Caller, Depends(caller_of(services.keys))]

    # response_model documents the body in /openapi.json; the answers are returned as responses,
    # so FastAPI does not validate them a second time.
    @routes.get("/v1/models", response_model=ModelList)
    async def list_models(caller: Authenticated) -> Response:
        return json_response(services.catalogue.cards())

    # `:path`, so catalogue names with slashes ("@cf/zai-org/glm-4.7-flash") are ids too
    @routes.get("/v1/models/{model_id:path}", response_model=ModelCard)
    async def retrieve_model(model_id: str, caller: Authenticated) -> Response:
        return json_response(services.catalogue.card(model_id))

    @routes.post("/v1/chat/completions", response_model=ChatCompletion)
    async def chat_completions(body: ChatCompletionRequest, caller: Authenticated) -> Response:
        ignored = ignored_fields_header(body)
        if body.stream:
            stream = await services.chat.stream(body, caller.context, caller.telemetry)
            events = openai_chunks(body, stream.value)
            return event_stream(events, openai_error_body, {**stream.headers, **ignored})
        answer = await services.chat.complete(body, caller.context, caller.telemetry)
        return json_response(answer.value, {**answer.headers, **ignored})

    @routes.post("/v1/completions", response_model=Completion)
    async def completions(body: CompletionRequest, caller: Authenticated) -> Response:
        """Legacy completions: the prompt as is (no chat template), on the chat models."""
        ignored = ignored_fields_header(body)
        chat = body.as_chat()
        if body.stream:
            stream = await services.chat.stream(chat, caller.context, caller.telemetry)
            events = completion_chunks(body, chat, stream.value)
            return event_stream(events, openai_error_body, {**stream.headers, **ignored})
        answer = await services.chat.complete(chat, caller.context, caller.telemetry)
        return json_response(legacy_completion(body, answer.value), {**answer.headers, **ignored})

    @routes.post("/v1/embeddings", response_model=CreateEmbeddingResponse)
    async def embeddings(body: EmbeddingRequest, caller: Authenticated) -> Response:
        answer = await services.embeddings.create(body, caller.context, caller.telemetry)
        return json_response(answer.value.body(), {**answer.headers, **ignored_fields_header(body)})

    @routes.post("/v1/moderations", response_model=ModerationCreateResponse)
    async def moderations(body: ModerationRequest, caller: Authenticated) -> Response:
        answer = await services.moderations.create(body, caller.context, caller.telemetry)
        return json_response(answer.value, {**answer.headers, **ignored_fields_header(body)})

    return routes


async def openai_chunks(
    chat: ChatCompletionRequest, chunks: AsyncIterator[GenerationChunk]
) -> AsyncIterator[str]:
    """`chat.completion.chunk` events: per choice the assistant role first, then the text (with
    its tokens' logprobs if asked); a choice's tool calls as OpenAI streams them (each call's
    head, then its argument fragments) before the chunk that finishes it; then the usage if the
    client asked for it."""
    chunk_id, created = chat_completion_id(), created_timestamp()

    def event(choices: list[ChunkChoice], usage: Usage | None = None) -> str:
        return ChatCompletionChunk(
            id=chunk_id, created=created, model=chat.model, choices=choices, usage=usage
        ).model_dump_json()

    for index in range(chat.n):
        yield event([ChunkChoice(index=index, delta=ChoiceDelta(role="assistant", content=""))])
    last: GenerationChunk | None = None
    async for chunk in chunks:
        last = chunk
        logprobs = ChoiceLogprobs.from_tokens(chunk.logprobs) if chat.logprobs else None
        if chunk.tool_calls:
            if chunk.text:
                yield event([ChunkChoice(index=chunk.index, delta=ChoiceDelta(content=chunk.text))])
            for number, call in enumerate(chunk.tool_calls):
                for piece in ChoiceDeltaToolCall.deltas_of(number, call):
                    delta = ChoiceDelta(tool_calls=[piece])
                    yield event([ChunkChoice(index=chunk.index, delta=delta)])
            delta = ChoiceDelta()
        else:
            delta = ChoiceDelta(content=chunk.text)
        choice = ChunkChoice(
            index=chunk.index, delta=delta, logprobs=logprobs, finish_reason=chunk.finish_reason
        )
        yield event([choice])
    if chat.include_usage and last is not None:
        yield event([], Usage.from_counts(last.prompt_tokens, last.completion_tokens))


def legacy_completion(body: CompletionRequest, chat: ChatCompletion) -> Completion:
    """A chat answer in the legacy `text_completion` layout (the prompt first with `echo`)."""
    echo = body.prompt_text if body.echo else ""
    return Completion(
        id=completion_id(),
        created=chat.created,
        model=chat.model,
        choices=[
            CompletionChoice(
                text=echo + (choice.message.content or ""),
                index=choice.index,
                logprobs=None
                if choice.logprobs is None
                else CompletionLogprobs.from_tokens(choice.logprobs.content or [], len(echo)),
                finish_reason=_legacy_finish(choice.finish_reason),
            )
            for choice in chat.choices
        ],
        usage=chat.usage,
    )


def _legacy_finish(reason: str | None) -> Any:
    return "stop" if reason == "tool_calls" else reason


async def completion_chunks(
    body: CompletionRequest, chat: ChatCompletionRequest, chunks: AsyncIterator[GenerationChunk]
) -> AsyncIterator[str]:
    """`text_completion` events: with `echo`, each choice's prompt first; then the text; then
    the usage if the client asked for it."""
    cmpl_id, created = completion_id(), created_timestamp()

    def event(choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        return Completion(
            id=cmpl_id, created=created, model=body.model, choices=choices, usage=usage
        ).model_dump_json()

    offsets = dict.fromkeys(range(body.n), 0)
    if body.echo:
        for index in range(body.n):
            yield event([CompletionChoice(text=body.prompt_text, index=index, finish_reason=None)])
            offsets[index] = len(body.prompt_text)
    last: GenerationChunk | None = None
    async for chunk in chunks:
        last = chunk
        logprobs = None
        if body.logprobs is not None:
            logprobs = CompletionLogprobs.from_tokens(chunk.logprobs, offsets[chunk.index])
        offsets[chunk.index] += len(chunk.text)
        yield event(
            [
                CompletionChoice(
                    text=chunk.text,
                    index=chunk.index,
                    logprobs=logprobs,
                    finish_reason=_legacy_finish(chunk.finish_reason),
                )
            ]
        )
    if chat.include_usage and last is not None:
        yield event([], Usage.from_counts(last.prompt_tokens, last.completion_tokens))
