"""The Workers AI API: `POST /ai/run/{model}`, and Cloudflare's own paths
`/client/v4/accounts/{account_id}/ai/run/{model}` and `/accounts/{account_id}/ai/run/{model}` (what
the cloudflare SDK calls; the model a path, so `@cf/...` catalogue names work), run any model with
its task's natural input and answer in Cloudflare's `{result, success, errors, messages}`
envelope, errors included; `.../ai/models/search` lists the models as Workers AI does."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime,
# and `Authenticated` is local to the router factory.
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Response
from pydantic import ValidationError

from deployments.api.caller import Caller, caller_of
from deployments.api.openai import openai_chunks
from deployments.api.responses import json_response, json_text
from deployments.api.streaming import OpenedStream, held_event_stream
from deployments.edge.waiting import ColdStartNotice
from deployments.errors import ServingError
from deployments.protocol import (
    WORKERS_INPUT_BY_TASK,
    ChatCompletionRequest,
    OpenAIRequest,
    WorkersChatResult,
    error_envelope,
    ok_envelope,
    rejects_if_busy,
    request_error_from_validation,
    workers_chat_to_chat_request,
    workers_embedding_result,
)
from deployments.protocol.workers_ai import (
    MAX_MODELS_PER_PAGE,
    MAX_PAGE,
    WorkersModerationVerdict,
    WorkersOpenAIChatInput,
    WorkersToolCall,
    page_envelope,
    unknown_fields_error,
)
from deployments.runtime.outputs import GenerationChunk
from deployments.serving.context import RequestContext
from deployments.serving.services import RouterServices

PREFIX = "/ai"
# Cloudflare's account-scoped prefixes (with and without the API's /client/v4 base)
ACCOUNT_PREFIXES = ("/client/v4/accounts/{account_id}/ai", "/accounts/{account_id}/ai")
# Paths answered in the envelope: ours and Cloudflare's, except the OpenAI-compatible /ai/v1/*.
ERROR_PATTERN = r"^(/ai|(/client/v4)?/accounts/[^/]+/ai)(/(?!v1/)|$)"


def error_body(error: ServingError) -> dict[str, Any]:
    return error_envelope(error)


def workers_ai_routes(services: RouterServices, prefix: str = PREFIX) -> APIRouter:
    routes = APIRouter(prefix=prefix)
    Authenticated = Annotated[Caller, Depends(caller_of(services.keys))]

    @routes.post("/run/{model_name:path}")
    async def run_model(
        model_name: str, body: Annotated[dict[str, Any], Body()], caller: Authenticated
    ) -> Response:
        """Run any model with its task's natural input; answers in a Workers-AI envelope."""
        ctx, telemetry = caller.context, caller.telemetry
        model = services.catalogue.get(model_name)
        telemetry.request(task=model.task, model=model.name)
        if model.task == "chat" and model_name != model.name:
            return await run_chat_alias(model_name, body, caller)
        task_input: Any = _validated(WORKERS_INPUT_BY_TASK[model.task], body, model.task)
        ctx = ctx.rejecting_if_busy(rejects_if_busy(task_input))
        result: Any
        if model.task == "chat":
            chat = workers_chat_to_chat_request(model.name, task_input)
            if chat.stream:
                return await _chat_stream(chat, ctx, caller, workers_chunks)
            answer: Any = await services.chat.complete(chat, ctx, telemetry, use_cache=False)
            completion = answer.value
            message = completion.choices[0].message
            calls = [WorkersToolCall.from_openai(c) for c in message.tool_calls or []]
            result = WorkersChatResult(
                response=message.content or "", usage=completion.usage, tool_calls=calls or None
            )
        elif model.task == "embedding":
            answer = await services.embeddings.embed(model.name, task_input.texts, ctx, telemetry)
            result = workers_embedding_result(answer.value.vectors)
        else:
            answer = await services.moderations.classify(
                model.name, task_input.texts, ctx, telemetry
            )
            result = [WorkersModerationVerdict.of(verdict) for verdict in answer.value]
        return json_response(ok_envelope(result), answer.headers)

    async def run_chat_alias(alias: str, body: dict[str, Any], caller: Caller) -> Response:
        """A chat model by its catalogue name answers as that record defines: OpenAI's chat
        request in, a `chat.completion` (streamed: `chat.completion.chunk` events) out."""
        chat_input = _validated(WorkersOpenAIChatInput, body, "chat")
        ctx = caller.context.rejecting_if_busy(rejects_if_busy(chat_input))
        chat = chat_input.as_chat(alias)
        if chat.stream:
            return await _chat_stream(chat, ctx, caller, partial(openai_chunks, chat))
        answer = await services.chat.complete(chat, ctx, caller.telemetry, use_cache=False)
        return json_response(ok_envelope(answer.value), answer.headers)

    async def _chat_stream(
        chat: ChatCompletionRequest,
        ctx: RequestContext,
        caller: Caller,
        shape: Callable[[AsyncIterator[GenerationChunk]], AsyncIterator[str]],
    ) -> Response:
        notice = ColdStartNotice()

        async def opening() -> OpenedStream:
            stream = await services.chat.stream(chat, ctx, caller.telemetry, notice)
            return shape(stream.value), stream.headers

        return await held_event_stream(opening(), notice, error_body, {})

    @routes.get("/models/search")
    async def search_models(
        caller: Authenticated,
        search: str | None = None,
        task: str | None = None,
        page: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1,
        per_page: Annotated[int, Query(ge=1, le=MAX_MODELS_PER_PAGE)] = 50,
    ) -> Response:
        """The models (by every name they answer to) in Workers AI's catalogue shape, paged."""
        models = services.catalogue.workers_models(search, task)
        return json_response(page_envelope(models, page, per_page))

    return routes


def _validated(kind: type[OpenAIRequest], body: dict[str, Any], task: str) -> Any:
    """`body` as a `kind`; Workers AI refuses a field its schema does not define (a 400)."""
    try:
        task_input = kind.model_validate(body)
    except ValidationError as exc:
        raise request_error_from_validation(exc.errors()) from None
    unknown = unknown_fields_error(task_input, task)
    if unknown is not None:
        raise unknown
    return task_input


async def workers_chunks(chunks: AsyncIterator[GenerationChunk]) -> AsyncIterator[str]:
    async for chunk in chunks:
        yield json_text(WorkersChatResult(response=chunk.text))
