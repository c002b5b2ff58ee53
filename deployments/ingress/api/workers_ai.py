"""The Workers AI API: `POST /ai/run/{model}`, and Cloudflare's own paths
`/client/v4/accounts/{account_id}/ai/run/{model}` and `/accounts/{account_id}/ai/run/{model}` (what
the cloudflare SDK calls; the model a path, so `@cf/...` catalogue names work), run any model with
its task's natural input and answer in Cloudflare's `{result, success, errors, messages}`
envelope, errors included; `.../ai/models/search` lists the models as Workers AI does."""

# No `from __future__ import annotations`: FastAPI reads the routes' annotations at runtime,
# so they resolve `Authenticated` and the request types in this module.
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request, Response

from deployments.contracts.outputs import GenerationChunk
from deployments.errors import ServingError
from deployments.ingress.api.app_services import services_of
from deployments.ingress.api.caller import authenticated
from deployments.ingress.api.openai import openai_chunks, opened_chat_stream
from deployments.ingress.api.responses import json_response, json_text
from deployments.ingress.api.streaming import held_event_stream
from deployments.ingress.protocol import (
    WorkersChatResult,
    error_envelope,
    ok_envelope,
)
from deployments.ingress.protocol.workers_ai import (
    MAX_MODELS_PER_PAGE,
    MAX_PAGE,
    page_envelope,
)
from deployments.ingress.protocol.workers_batch import is_batch_request
from deployments.ingress.serving.context import RequestContext

PREFIX = "/ai"
# Cloudflare's account-scoped prefixes (with and without the API's /client/v4 base)
ACCOUNT_PREFIXES = ("/client/v4/accounts/{account_id}/ai", "/accounts/{account_id}/ai")
# Paths answered in the envelope: ours and Cloudflare's, except the OpenAI-compatible /ai/v1/*.
ERROR_PATTERN = r"^(/ai|(/client/v4)?/accounts/[^/]+/ai)(/(?!v1/)|$)"


def error_body(error: ServingError) -> dict[str, Any]:
    return error_envelope(error)


# Mounted at PREFIX and at each of ACCOUNT_PREFIXES (make_app).
routes = APIRouter()
Authenticated = Annotated[RequestContext, Depends(authenticated)]


@routes.post("/run/{model_name:path}")
async def run_model(
    model_name: str,
    body: Annotated[dict[str, Any], Body()],
    ctx: Authenticated,
    request: Request,
    queue_request: Annotated[bool, Query(alias="queueRequest")] = False,
) -> Response:
    """Run any model with its task's natural input; answers in a Workers-AI envelope. With
    `queueRequest` (or a bare `{"request_id"}`), the Batch API: submit or poll a job."""
    services = services_of(request)
    if is_batch_request(body, queue_request):
        return json_response(ok_envelope(await services.batch.answer(model_name, body, ctx)))
    model = services.catalogue.get(model_name)
    ctx.telemetry.request(task=model.task, model=model.name)
    given = services.workers.parse(model_name, body)
    ctx = ctx.rejecting_if_busy(given.rejects_if_busy)
    if given.stream:
        chat = given.chat()
        shape = partial(openai_chunks, chat) if given.alias else workers_chunks
        opening = opened_chat_stream(services.chat, chat, ctx, shape)
        return await held_event_stream(opening, ctx.warming, error_body, {})
    answer = await services.workers.run(given, ctx)
    return json_response(ok_envelope(answer.result), answer.headers)


@routes.get("/models/search")
async def search_models(
    ctx: Authenticated,
    request: Request,
    search: str | None = None,
    task: str | None = None,
    page: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1,
    per_page: Annotated[int, Query(ge=1, le=MAX_MODELS_PER_PAGE)] = 50,
) -> Response:
    """The models (by every name they answer to) in Workers AI's catalogue shape, paged."""
    models = services_of(request).catalogue.workers_models(search, task)
    return json_response(page_envelope(models, page, per_page))


async def workers_chunks(chunks: AsyncIterator[GenerationChunk]) -> AsyncIterator[str]:
    async for chunk in chunks:
        yield json_text(WorkersChatResult(response=chunk.text))
