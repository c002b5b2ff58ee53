"""The OpenAI-compatible API: /v1/models (list and retrieve), /v1/chat/completions,
/v1/completions (legacy), /v1/embeddings, /v1/moderations."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime,
# so they resolve `Authenticated` and the request types in this module.
import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from functools import partial
from typing import Annotated, Any, cast

from fastapi import APIRouter, Depends, Request, Response

from deployments.contracts.outputs import GenerationChunk
from deployments.ingress.api.app_services import services_of
from deployments.ingress.api.caller import authenticated
from deployments.ingress.api.errors import openai_error_body
from deployments.ingress.api.responses import ignored_fields_header, json_response
from deployments.ingress.api.streaming import OpenedStream, held_event_stream
from deployments.ingress.protocol import (
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
    rejects_if_busy,
)
from deployments.ingress.protocol.completions import (
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    completion_id,
)
from deployments.ingress.serving.answer import Answer
from deployments.ingress.serving.chat import ChatService
from deployments.ingress.serving.context import RequestContext
from deployments.observability import RequestTelemetry

routes = APIRouter()
Authenticated = Annotated[RequestContext, Depends(authenticated)]


# response_model documents the body in /openapi.json; the answers are returned as responses,
# so FastAPI does not validate them a second time.
@routes.get("/v1/models", response_model=ModelList)
async def list_models(ctx: Authenticated, request: Request) -> Response:
    return json_response(services_of(request).catalogue.cards())


# `:path`, so catalogue names with slashes ("@cf/zai-org/glm-4.7-flash") are ids too
@routes.get("/v1/models/{model_id:path}", response_model=ModelCard)
async def retrieve_model(model_id: str, ctx: Authenticated, request: Request) -> Response:
    return json_response(services_of(request).catalogue.card(model_id))


@routes.post("/v1/chat/completions", response_model=ChatCompletion)
async def chat_completions(
    body: ChatCompletionRequest, ctx: Authenticated, request: Request
) -> Response:
    ignored = ignored_fields_header(body)
    ctx = ctx.rejecting_if_busy(rejects_if_busy(body))
    service = services_of(request).chat
    if body.stream:
        opening = opened_chat_stream(service, body, ctx, partial(openai_chunks, body))
        return await held_event_stream(opening, ctx.warming, openai_error_body, ignored)
    answer = await service.complete(body, ctx)
    return json_response(answer.value, {**answer.headers, **ignored})


@routes.post("/v1/completions", response_model=Completion)
async def completions(body: CompletionRequest, ctx: Authenticated, request: Request) -> Response:
    """Legacy completions: each prompt as is (no chat template), on the chat models; the
    prompts of a list run side by side, each a chat request of its own."""
    ignored = ignored_fields_header(body)
    service = services_of(request).chat
    chats = [body.as_chat(prompt) for prompt in body.prompts]
    if body.stream:
        opening = _opened_completion_streams(service, body, chats, ctx)
        return await held_event_stream(opening, ctx.warming, openai_error_body, ignored)
    answers = await asyncio.gather(*(service.complete(chat, ctx) for chat in chats))
    completion = legacy_completion(body, [answer.value for answer in answers])
    if len(answers) > 1 and completion.usage is not None:  # each call told its own
        ctx.telemetry.usage(
            input_tokens=completion.usage.prompt_tokens,
            output_tokens=completion.usage.completion_tokens,
            finish_reason=completion.choices[-1].finish_reason,
        )
    # the last admission's rate-limit state is the key's current one
    return json_response(completion, {**answers[-1].headers, **ignored})


@routes.post("/v1/embeddings", response_model=CreateEmbeddingResponse)
async def embeddings(body: EmbeddingRequest, ctx: Authenticated, request: Request) -> Response:
    answer = await services_of(request).embeddings.create(body, ctx)
    return json_response(answer.value.body(), {**answer.headers, **ignored_fields_header(body)})


@routes.post("/v1/moderations", response_model=ModerationCreateResponse)
async def moderations(body: ModerationRequest, ctx: Authenticated, request: Request) -> Response:
    answer = await services_of(request).moderations.create(body, ctx)
    return json_response(answer.value, {**answer.headers, **ignored_fields_header(body)})


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
        yield event(
            [], Usage.from_counts(last.prompt_tokens, last.completion_tokens, last.cached_tokens)
        )


async def opened_chat_stream(
    service: ChatService,
    chat: ChatCompletionRequest,
    ctx: RequestContext,
    shape: Callable[[AsyncIterator[GenerationChunk]], AsyncIterator[str]],
) -> OpenedStream:
    """The chat's stream once its first chunk came, as `shape`'s events, with the headers of its
    answer: what a held stream (api.streaming) waits for."""
    stream = await service.stream(chat, ctx)
    return shape(stream.value), stream.headers


async def _opened_completion_streams(
    service: ChatService,
    body: CompletionRequest,
    chats: list[ChatCompletionRequest],
    ctx: RequestContext,
) -> OpenedStream:
    """Every prompt's stream, opened before the first byte (so a failure still has its status);
    they generate side by side, their events one prompt after the other. If one cannot open,
    those already open are closed."""
    opened: list[Answer[AsyncIterator[GenerationChunk]]] = []
    try:
        for chat in chats:
            opened.append(await service.stream(chat, ctx))
    except BaseException:
        for answer in opened:
            await cast(AsyncGenerator[GenerationChunk, None], answer.value).aclose()
        raise
    events = completion_chunks(body, [stream.value for stream in opened], ctx.telemetry)
    return events, opened[-1].headers


def legacy_completion(body: CompletionRequest, chats: list[ChatCompletion]) -> Completion:
    """The prompts' chat answers in the legacy `text_completion` layout: choice `c` of prompt
    `p` at index p * n + c; with `echo`, each prompt first (and its tokens' logprobs, when
    asked, with the generated ones)."""
    choices = []
    for number, (prompt, chat) in enumerate(zip(body.prompts, chats, strict=True)):
        echo = prompt if body.echo else ""
        for choice in chat.choices:
            logprobs = None
            if choice.logprobs is not None:
                echoed = (chat.prompt_logprobs or []) if body.echo else []
                logprobs = CompletionLogprobs.from_tokens(echoed).followed_by(
                    CompletionLogprobs.from_tokens(choice.logprobs.content or [], len(echo))
                )
            choices.append(
                CompletionChoice(
                    text=echo + (choice.message.content or ""),
                    index=number * body.n + choice.index,
                    logprobs=logprobs,
                    finish_reason=_legacy_finish(choice.finish_reason),
                )
            )
    return Completion(
        id=completion_id(),
        created=chats[0].created,
        model=chats[0].model,
        choices=choices,
        usage=Usage.from_counts(
            sum(chat.usage.prompt_tokens for chat in chats),
            sum(chat.usage.completion_tokens for chat in chats),
            sum(chat.usage.cached_tokens for chat in chats),
        ),
    )


def _legacy_finish(reason: str | None) -> Any:
    return "stop" if reason == "tool_calls" else reason


async def completion_chunks(
    body: CompletionRequest,
    streams: list[AsyncIterator[GenerationChunk]],
    telemetry: RequestTelemetry,
) -> AsyncIterator[str]:
    """`text_completion` events, one prompt's stream after the other (they generate side by
    side), indexed as a whole answer is: with `echo`, each choice's prompt first (with its
    tokens' logprobs when asked); then the text; then the usage if the client asked for it."""
    cmpl_id, created = completion_id(), created_timestamp()
    prompt_tokens = completion_tokens = cached_tokens = 0

    def event(choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        return Completion(
            id=cmpl_id, created=created, model=body.model, choices=choices, usage=usage
        ).model_dump_json()

    for number, (prompt, chunks) in enumerate(zip(body.prompts, streams, strict=True)):
        offsets = dict.fromkeys(range(body.n), 0)
        unechoed = set(range(body.n)) if body.echo else set()
        last: GenerationChunk | None = None
        async for chunk in chunks:
            last, index = chunk, number * body.n + chunk.index
            if chunk.index in unechoed:
                unechoed.discard(chunk.index)
                echoed = None
                if body.logprobs is not None and chunk.prompt_logprobs is not None:
                    echoed = CompletionLogprobs.from_tokens(chunk.prompt_logprobs)
                echo = CompletionChoice(
                    text=prompt, index=index, logprobs=echoed, finish_reason=None
                )
                yield event([echo])
                offsets[chunk.index] = len(prompt)
            logprobs = None
            if body.logprobs is not None:
                logprobs = CompletionLogprobs.from_tokens(chunk.logprobs, offsets[chunk.index])
            offsets[chunk.index] += len(chunk.text)
            choice = CompletionChoice(
                text=chunk.text,
                index=index,
                logprobs=logprobs,
                finish_reason=_legacy_finish(chunk.finish_reason),
            )
            yield event([choice])
        if last is not None:
            prompt_tokens += last.prompt_tokens
            completion_tokens += last.completion_tokens
            cached_tokens += last.cached_tokens
    if len(streams) > 1:  # each stream told the telemetry its own usage
        telemetry.usage(input_tokens=prompt_tokens, output_tokens=completion_tokens)
    if body.stream_options is not None and body.stream_options.include_usage:
        yield event([], Usage.from_counts(prompt_tokens, completion_tokens, cached_tokens))
