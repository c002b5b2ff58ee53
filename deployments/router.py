"""The router: the only HTTP ingress. Validate, pick the model's handle, call it, answer.

It holds one handle per model deployment and no model math; errors become OpenAI-shaped bodies
in deployments.http (or Workers-AI envelopes on /ai/run).
"""

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from sse_starlette import EventSourceResponse

from deployments.config import AppConfig
from deployments.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    ServingError,
    WrongTaskError,
)
from deployments.http import (
    BodyLimitMiddleware,
    as_serving_error,
    install_error_handlers,
)
from deployments.protocol import (
    WORKERS_INPUT_BY_TASK,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionRequest,
    Choice,
    ChoiceDelta,
    ChunkChoice,
    CreateEmbeddingResponse,
    Embedding,
    EmbeddingRequest,
    EmbeddingUsage,
    ModelCard,
    ModelList,
    Moderation,
    ModerationCreateResponse,
    ModerationRequest,
    Usage,
    WorkersChatResult,
    WorkersEmbeddingResult,
    chat_completion_id,
    chat_messages_as_dicts,
    created_timestamp,
    error_envelope,
    moderation_id,
    ok_envelope,
    request_error_from_validation,
    workers_chat_to_chat_request,
)
from deployments.protocol.models import Task
from deployments.runtime.llm import Completion, GenerationChunk
from deployments.runtime.sampling import SamplingParams

app = FastAPI(
    title="ray-edge-ai",
    description="OpenAI-compatible and Workers-AI-style inference at the (simulated) edge",
    version="0.1.0",
)
app.state.max_body_bytes = 1 << 20
install_error_handlers(app)
app.add_middleware(BodyLimitMiddleware, limit=lambda: app.state.max_body_bytes)
# Ray Serve's proxy already echoes the client's x-request-id (or makes one) on every response.

DONE = "[DONE]"


@dataclass(frozen=True)
class ServedModel:
    name: str
    task: Task
    family: str
    handle: DeploymentHandle


def _sampling(request: ChatCompletionRequest) -> SamplingParams:
    return SamplingParams(
        max_tokens=request.effective_max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        # OpenAI takes any int64 seed; numpy's generator wants a non-negative one.
        seed=None if request.seed is None else request.seed % 2**64,
        stop=request.stop_sequences,
    )


@serve.ingress(app)
class RouterIngress:
    def __init__(self, config: dict[str, Any], servers: Mapping[str, DeploymentHandle]):
        self.config = AppConfig.model_validate(config)
        app.state.max_body_bytes = self.config.router.max_body_bytes
        self.timeout_s = self.config.router.request_timeout_s
        self.models = {
            name: ServedModel(name, m.task, m.family, servers[name])
            for name, m in self.config.models.items()
        }
        self.created = int(time.time())

    # ---- lookups and calls --------------------------------------------------------------

    def _model(self, name: str, task: Task) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise ModelNotFoundError(
                f"the model {name!r} does not exist; GET /v1/models lists them", param="model"
            )
        if model.task != task:
            raise WrongTaskError(
                f"{name!r} serves the {model.task} task; this endpoint needs a {task} model",
                param="model",
            )
        return model

    async def _call(self, response: Awaitable[Any]) -> Any:
        async def resolve() -> Any:
            return await response

        try:
            return await asyncio.wait_for(resolve(), self.timeout_s)
        except ServingError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to one client-visible error
            raise as_serving_error(exc) from None

    async def _open_stream(
        self, model: ServedModel, messages: list[dict[str, Any]], params: SamplingParams
    ) -> tuple[GenerationChunk, DeploymentResponseGenerator]:
        """Start generation and wait for the first chunk, so errors still get a real status."""
        stream = model.handle.options(stream=True).stream.remote(messages, params)
        first = await self._call(stream.__anext__())
        return first, stream

    async def _rest(
        self, first: GenerationChunk, stream: DeploymentResponseGenerator
    ) -> AsyncIterator[GenerationChunk]:
        chunk = first
        try:
            while True:
                yield chunk
                if chunk.finish_reason is not None:
                    return
                chunk = await stream.__anext__()
        finally:
            stream.cancel()  # the client left or the stream ended: free the model's slot

    # ---- health and catalogue -----------------------------------------------------------

    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(self) -> dict[str, Any]:
        status = await asyncio.to_thread(serve.status)
        app_name = serve.get_replica_context().app_name
        deployments = status.applications[app_name].deployments
        models = {
            name: {
                "status": str(deployments[name].status.value),
                "running_replicas": deployments[name].replica_states.get("RUNNING", 0),
            }
            for name in self.models
        }
        ready = [name for name, m in models.items() if m["running_replicas"] > 0]
        return {"ready": ready, "models": models}

    @app.get("/v1/models", response_model=ModelList)
    async def list_models(self) -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=m.name, created=self.created, task=m.task, family=m.family)
                for m in self.models.values()
            ]
        )

    # ---- OpenAI-compatible API ----------------------------------------------------------

    @app.post("/v1/chat/completions", response_model=ChatCompletion)
    async def chat_completions(self, request: ChatCompletionRequest) -> Any:
        model = self._model(request.model, "chat")
        messages, params = chat_messages_as_dicts(request), _sampling(request)
        if request.stream:
            first, stream = await self._open_stream(model, messages, params)
            events = self._openai_chunks(model.name, self._rest(first, stream), request)
            return EventSourceResponse(events, ping=15)
        done: Completion = await self._call(model.handle.complete.remote(messages, params))
        return ChatCompletion(
            id=chat_completion_id(),
            created=created_timestamp(),
            model=model.name,
            choices=[
                Choice(
                    index=0,
                    message=ChatCompletionMessage(content=done.text),
                    finish_reason=done.finish_reason,
                )
            ],
            usage=Usage.from_counts(done.prompt_tokens, done.completion_tokens),
        )

    async def _openai_chunks(
        self, model: str, chunks: AsyncIterator[GenerationChunk], request: ChatCompletionRequest
    ) -> AsyncIterator[str]:
        ids = {"id": chat_completion_id(), "created": created_timestamp(), "model": model}

        def event(choices: list[ChunkChoice], usage: Usage | None = None) -> str:
            return ChatCompletionChunk(**ids, choices=choices, usage=usage).model_dump_json()

        yield event([ChunkChoice(index=0, delta=ChoiceDelta(role="assistant", content=""))])
        last: GenerationChunk | None = None
        try:
            async for chunk in chunks:
                last = chunk
                delta = ChoiceDelta(content=chunk.text)
                yield event([ChunkChoice(index=0, delta=delta, finish_reason=chunk.finish_reason)])
            if request.include_usage and last is not None:
                yield event([], Usage.from_counts(last.prompt_tokens, last.completion_tokens))
        except Exception as exc:  # noqa: BLE001 - after the first byte an error is an event
            yield JSONResponse(as_serving_error(exc).to_error_body()).body.decode()
        yield DONE

    @app.post("/v1/embeddings", response_model=CreateEmbeddingResponse)
    async def embeddings(self, request: EmbeddingRequest) -> CreateEmbeddingResponse:
        model = self._model(request.model, "embedding")
        result = await self._call(model.handle.embed.remote(request.texts))
        dimension = result.vectors.shape[1]
        if request.dimensions is not None and request.dimensions != dimension:
            raise InvalidRequestError(
                f"{model.name!r} returns {dimension}-dimensional vectors; "
                f"dimensions={request.dimensions} is not available",
                param="dimensions",
            )
        return CreateEmbeddingResponse(
            data=[
                Embedding.from_vector(i, vector, request.encoding_format)
                for i, vector in enumerate(result.vectors)
            ],
            model=model.name,
            usage=EmbeddingUsage(
                prompt_tokens=result.total_tokens, total_tokens=result.total_tokens
            ),
        )

    @app.post("/v1/moderations", response_model=ModerationCreateResponse)
    async def moderations(self, request: ModerationRequest) -> ModerationCreateResponse:
        model = self._model(request.model, "moderation")
        results = await self._call(model.handle.classify.remote(request.texts))
        return ModerationCreateResponse(
            id=moderation_id(),
            model=model.name,
            results=[Moderation.from_scores(r.category_scores, r.categories) for r in results],
        )

    # ---- Workers-AI-style API -----------------------------------------------------------

    @app.post("/ai/run/{model_name}")
    async def run_model(self, model_name: str, body: Annotated[dict[str, Any], Body()]) -> Any:
        """Run any model with its task's natural input; answers in a Workers-AI envelope."""
        try:
            model = self.models.get(model_name)
            if model is None:
                raise ModelNotFoundError(f"the model {model_name!r} does not exist", param="model")
            try:
                task_input = WORKERS_INPUT_BY_TASK[model.task].model_validate(body)
            except ValidationError as exc:
                raise request_error_from_validation(exc.errors()) from None
            return await self._run_task(model, task_input)
        except ServingError as error:
            return JSONResponse(error_envelope(error.status, error.message), error.status)

    async def _run_task(self, model: ServedModel, task_input: Any) -> Any:
        if model.task == "embedding":
            result = await self._call(model.handle.embed.remote(task_input.texts))
            return ok_envelope(WorkersEmbeddingResult.from_vectors(result.vectors))
        if model.task == "moderation":
            results = await self._call(model.handle.classify.remote(task_input.texts))
            return ok_envelope(
                [Moderation.from_scores(r.category_scores, r.categories) for r in results]
            )
        request = workers_chat_to_chat_request(model.name, task_input)
        messages, params = chat_messages_as_dicts(request), _sampling(request)
        if request.stream:
            first, stream = await self._open_stream(model, messages, params)
            return EventSourceResponse(self._workers_chunks(self._rest(first, stream)), ping=15)
        done: Completion = await self._call(model.handle.complete.remote(messages, params))
        usage = Usage.from_counts(done.prompt_tokens, done.completion_tokens)
        return ok_envelope(WorkersChatResult(response=done.text, usage=usage))

    async def _workers_chunks(self, chunks: AsyncIterator[GenerationChunk]) -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield WorkersChatResult(response=chunk.text).model_dump_json()
        except Exception as exc:  # noqa: BLE001 - after the first byte an error is an event
            error = as_serving_error(exc)
            yield JSONResponse(error_envelope(error.status, error.message)).body.decode()
        yield DONE
