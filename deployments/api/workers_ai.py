"""The Workers-AI-style API: `POST /ai/run/{model}` runs any model with its task's natural input
and answers in Cloudflare's `{result, success, errors, messages}` envelope, errors included."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime,
# and `Authenticated` is local to the router factory.
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Response
from pydantic import ValidationError

from deployments.api.caller import Caller, caller_of
from deployments.api.responses import json_response, json_text
from deployments.api.streaming import event_stream
from deployments.errors import ServingError
from deployments.protocol import (
    WORKERS_INPUT_BY_TASK,
    WorkersChatResult,
    WorkersEmbeddingResult,
    error_envelope,
    ok_envelope,
    request_error_from_validation,
    workers_chat_to_chat_request,
)
from deployments.runtime.llm import GenerationChunk
from deployments.serving.services import RouterServices

PREFIX = "/ai"


def error_body(error: ServingError) -> dict[str, Any]:
    return error_envelope(error.status, error.message)


def workers_ai_routes(services: RouterServices) -> APIRouter:
    routes = APIRouter(prefix=PREFIX)
    Authenticated = Annotated[Caller, Depends(caller_of(services.keys))]

    @routes.post("/run/{model_name}")
    async def run_model(
        model_name: str, body: Annotated[dict[str, Any], Body()], caller: Authenticated
    ) -> Response:
        """Run any model with its task's natural input; answers in a Workers-AI envelope."""
        ctx, telemetry = caller.context, caller.telemetry
        model = services.catalogue.get(model_name)
        telemetry.request(task=model.task, model=model.name)
        try:
            task_input: Any = WORKERS_INPUT_BY_TASK[model.task].model_validate(body)
        except ValidationError as exc:
            raise request_error_from_validation(exc.errors()) from None
        result: Any
        if model.task == "chat":
            chat = workers_chat_to_chat_request(model.name, task_input)
            if chat.stream:
                stream = await services.chat.stream(chat, ctx, telemetry)
                return event_stream(workers_chunks(stream.value), error_body, stream.headers)
            answer: Any = await services.chat.complete(chat, ctx, telemetry, use_cache=False)
            completion = answer.value
            result = WorkersChatResult(
                response=completion.choices[0].message.content, usage=completion.usage
            )
        elif model.task == "embedding":
            answer = await services.embeddings.embed(model.name, task_input.texts, ctx, telemetry)
            result = WorkersEmbeddingResult.from_vectors(answer.value.vectors)
        else:
            answer = await services.moderations.classify(
                model.name, task_input.texts, ctx, telemetry
            )
            result = answer.value
        return json_response(ok_envelope(result), answer.headers)

    return routes


async def workers_chunks(chunks: AsyncIterator[GenerationChunk]) -> AsyncIterator[str]:
    async for chunk in chunks:
        yield json_text(WorkersChatResult(response=chunk.text))
