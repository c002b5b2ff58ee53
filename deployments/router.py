"""The router: the only HTTP ingress. Validate, route through the simulated edge to the model's
handle, answer. It holds one handle per model deployment and does no model math; errors become
OpenAI-shaped bodies in deployments.http (or Workers-AI envelopes on /ai/run).

A request's path: endpoint -> (cache) -> EdgeDispatcher picks a colo and fails over -> handle.
"""

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Body, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from ray import serve
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator
from sse_starlette import EventSourceResponse

from deployments.cache import ResponseCache, wants_bypass
from deployments.config import AppConfig
from deployments.edge import EdgeDispatcher, EdgeTrace, RegionPools
from deployments.edge_control import SYNC_INTERVAL_S, apply_snapshot
from deployments.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    ServingError,
    WrongTaskError,
)
from deployments.http import (
    BodyLimitMiddleware,
    as_serving_error,
    error_headers,
    install_error_handlers,
)
from deployments.observability import RouterObservability, TelemetryMiddleware
from deployments.observability.middleware import request_telemetry
from deployments.observability.router_telemetry import RequestTelemetry
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
from deployments.runtime.llm import DEFAULT_MAX_NEW_TOKENS, Completion, GenerationChunk
from deployments.runtime.sampling import SamplingParams
from deployments.security import (
    KeyStore,
    ModerationGate,
    Principal,
    RateLimiter,
    Reservation,
    check_chat,
    check_texts,
    estimate_chat_tokens,
    estimate_text_tokens,
    metered_stream,
)
from deployments.servers.base import Reply
from edge_sim.faults import ColoFault
from edge_sim.network import EdgeNetwork

app = FastAPI(
    title="ray-edge-ai",
    description="OpenAI-compatible and Workers-AI-style inference at the (simulated) edge",
    version="0.1.0",
)
app.state.max_body_bytes = 1 << 20
install_error_handlers(app)
app.state.observability = None
app.add_middleware(BodyLimitMiddleware, limit=lambda: app.state.max_body_bytes)
# Outermost, so a 413 is measured too. Ray Serve's proxy already echoes the client's
# x-request-id (or makes one) on every response.
app.add_middleware(TelemetryMiddleware, observability=lambda: app.state.observability)


def authenticated(request: Request) -> Principal:
    """FastAPI dependency: the caller of a model endpoint (401 before the body is validated)."""
    principal = request.app.state.keys.authenticate(request.headers.get("authorization"))
    request_telemetry(request).authenticated(principal.key_id)
    return principal


Caller = Annotated[Principal, Depends(authenticated)]

log = logging.getLogger("ray.serve")
DONE = "[DONE]"
T = TypeVar("T")


@dataclass(frozen=True)
class ServedModel:
    name: str
    task: Task
    family: str


def _sampling(request: ChatCompletionRequest) -> SamplingParams:
    return SamplingParams(
        max_tokens=request.effective_max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        # OpenAI takes any int64 seed; numpy's generator wants a non-negative one.
        seed=None if request.seed is None else request.seed % 2**64,
        stop=request.stop_sequences,
    )


def _is_deterministic(request: ChatCompletionRequest) -> bool:
    return not request.stream and (request.temperature == 0 or request.seed is not None)


def _router_replicas() -> int:
    """How many router replicas share each key's rate limit (1 outside Ray Serve)."""
    try:
        return max(1, int(serve.get_replica_context().world_size or 1))
    except (RuntimeError, AttributeError, TypeError):
        return 1


def _client_ip(request: Request) -> str | None:
    return request.client.host if request.client else None


async def _observed(
    chunks: AsyncIterator[GenerationChunk], telemetry: RequestTelemetry
) -> AsyncIterator[GenerationChunk]:
    """Pass a stream through, telling the request's telemetry its usage or its failure."""
    try:
        async for chunk in chunks:
            if chunk.finish_reason is not None:
                telemetry.usage(
                    input_tokens=chunk.prompt_tokens,
                    output_tokens=chunk.completion_tokens,
                    finish_reason=chunk.finish_reason,
                )
            yield chunk
    except Exception as exc:
        telemetry.failed(exc)
        raise


async def _resolve(response: Awaitable[T]) -> T:
    """Await a model call, turning whatever it raised into the one client-visible error."""
    try:
        return await response
    except ServingError:
        raise
    except Exception as exc:  # noqa: BLE001 - mapped, so the edge can fail over on 5xx
        raise as_serving_error(exc) from None


@serve.ingress(app)
class RouterIngress:
    def __init__(
        self,
        config: dict[str, Any],
        servers: Mapping[str, Mapping[str, DeploymentHandle]],
        control: DeploymentHandle | None = None,
    ):
        self.config = AppConfig.model_validate(config)
        router = self.config.router
        app.state.max_body_bytes = router.max_body_bytes
        self.timeout_s = router.request_timeout_s
        self.models = {
            name: ServedModel(name, m.task, m.family) for name, m in self.config.models.items()
        }
        self.created = int(time.time())
        edge = self.config.edge
        self.network = EdgeNetwork(edge)
        self.pools = RegionPools(
            servers, edge.region_policy, router.default_cold_start_ms, control=control
        )
        self.edge: EdgeDispatcher[Any] = EdgeDispatcher(
            self.network,
            edge.region_map(),
            self.pools,
            router.failover_attempts,
            edge.routing.max_extra_rtt_ms,
        )
        self.cache = ResponseCache(router.cache)
        security = self.config.security
        self.keys = KeyStore.from_env(os.environ, security, log)
        app.state.keys = self.keys
        self.limiter = RateLimiter(share=1 / _router_replicas())
        self.limits = security.request_limits
        self.gate = ModerationGate(security.moderation_gate, self._flags)
        app.state.observability = RouterObservability(self.config.observability, self.models)
        self._control = control
        self._fault_version = 0
        self._sync_task: asyncio.Task[None] | None = None

    # ---- fault drills shared across router replicas -------------------------------------

    def _keep_faults_in_sync(self) -> None:
        if self._control is not None and (self._sync_task is None or self._sync_task.done()):
            self._sync_task = asyncio.get_running_loop().create_task(self._sync_faults_forever())

    async def _sync_faults(self) -> None:
        assert self._control is not None
        version, faults = await self._control.snapshot.remote()
        if version != self._fault_version:
            apply_snapshot(self.network, faults)
            self._fault_version = version

    async def _sync_faults_forever(self) -> None:
        while True:
            try:
                await self._sync_faults()
            except Exception:  # noqa: BLE001 - a missed sync is retried; routing goes on
                log.warning("fault sync with edge-control failed", exc_info=True)
            await asyncio.sleep(SYNC_INTERVAL_S)

    # ---- lookups, admission, edge calls, cache ------------------------------------------

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

    def _admit_chat(
        self, chat: ChatCompletionRequest, principal: Principal
    ) -> tuple[list[dict[str, Any]], SamplingParams, Reservation]:
        """Request limits, then the key's rate limit (429) with the request's estimated tokens."""
        check_chat(chat, self.limits)
        messages, params = chat_messages_as_dicts(chat), _sampling(chat)
        estimate = estimate_chat_tokens(
            [m["content"] for m in messages], chat.effective_max_tokens, DEFAULT_MAX_NEW_TOKENS
        )
        return messages, params, self.limiter.reserve(principal, estimate)

    def _admit_texts(self, texts: list[str], principal: Principal) -> Reservation:
        check_texts(texts, self.limits)
        return self.limiter.reserve(principal, estimate_text_tokens(texts))

    async def _begin_texts(
        self, task: Task, body: BaseModel, texts: list[str], request: Request, principal: Principal
    ) -> tuple[ServedModel, Reservation, str | None, Any, EdgeTrace | None]:
        """An embeddings or moderations request up to the cache: (model, quota, cache key,
        cached response or None, trace of a hit)."""
        model_name = body.model
        request_telemetry(request).request(task=task, model=model_name, prompt=texts)
        model = self._model(model_name, task)
        quota = self._admit_texts(texts, principal)
        key, hit, trace = await self._cached(task, model, body, request, principal.key_id)
        return model, quota, key, hit, trace

    async def _call_texts(
        self, model: ServedModel, texts: list[str], request: Request, quota: Reservation
    ) -> tuple[Reply, EdgeTrace]:
        method = "embed" if model.task == "embedding" else "classify"
        traceparent = request_telemetry(request).traceparent
        try:
            return await self._via_edge(
                model,
                request,
                lambda handle: getattr(handle, method).remote(texts, traceparent),
            )
        except BaseException:
            quota.settle(0)
            raise

    async def _flags(self, texts: list[str]) -> list[bool]:
        """The moderation gate's classifier: the moderation deployment, called directly."""
        moderation = self.config.security.moderation_gate.moderation_model
        reply = await _resolve(self.pools.serving_handle(moderation).classify.remote(texts))
        return [result.flagged for result in reply.value]

    async def _via_edge(
        self,
        model: ServedModel,
        request: Request,
        call: Callable[[DeploymentHandle], Awaitable[Reply]],
    ) -> tuple[Reply, EdgeTrace]:
        self._keep_faults_in_sync()
        reply, trace = await self.edge.dispatch(
            model.name,
            request.headers,
            _client_ip(request),
            lambda handle: _resolve(call(handle)),
            reply_of=lambda reply: reply,
            deadline_s=self.timeout_s,
        )
        request_telemetry(request).routed(trace, trace.client)
        return reply, trace

    async def _cached(
        self, endpoint: str, model: ServedModel, body: BaseModel, request: Request, key_id: str
    ) -> tuple[str | None, Any, EdgeTrace | None]:
        """(cache key or None when not caching, cached response or None, trace of a hit)."""
        if wants_bypass(request.headers):
            return None, None, None
        key = self.cache.key(endpoint, body, key_id)
        hit = self.cache.get(key)
        if hit is None:
            return key, None, None
        trace = await self.edge.nearest(model.name, request.headers, _client_ip(request))
        trace.cache = "HIT"
        request_telemetry(request).routed(trace, trace.client)
        return key, hit, trace

    def _answer(
        self,
        response: Response,
        trace: EdgeTrace,
        quota: Reservation,
        key: str | None,
        value: Any,
    ) -> Any:
        if key is not None and trace.cache is None:
            self.cache.put(key, value)
            trace.cache = "MISS"
        response.headers.update({**trace.headers(), **quota.headers})
        return value

    # ---- chat generation (both APIs) ----------------------------------------------------

    async def _generate(
        self,
        model: ServedModel,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        request: Request,
        quota: Reservation,
    ) -> tuple[Completion, EdgeTrace]:
        telemetry = request_telemetry(request)
        gated = self.gate.applies_to(model.name)
        try:
            if gated:
                await self.gate.check_input(messages)
            reply, trace = await self._via_edge(
                model,
                request,
                lambda handle: handle.complete.remote(messages, params, telemetry.traceparent),
            )
            done: Completion = reply.value
            if gated:
                text, finish = await self.gate.filter_output(done.text, done.finish_reason)
                done = dataclasses.replace(done, text=text, finish_reason=finish)
        except BaseException:
            quota.settle(0)
            raise
        quota.settle(done.prompt_tokens + done.completion_tokens)
        telemetry.usage(
            input_tokens=done.prompt_tokens,
            output_tokens=done.completion_tokens,
            finish_reason=done.finish_reason,
        )
        return done, trace

    async def _generate_stream(
        self,
        model: ServedModel,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        request: Request,
        quota: Reservation,
    ) -> tuple[AsyncIterator[GenerationChunk], EdgeTrace]:
        telemetry = request_telemetry(request)
        gated = self.gate.applies_to(model.name)
        try:
            if gated:
                await self.gate.check_input(messages)
            self._keep_faults_in_sync()
            (first, stream), trace = await self.edge.dispatch(
                model.name,
                request.headers,
                _client_ip(request),
                lambda handle: _resolve(
                    self._open_stream(handle, messages, params, telemetry.traceparent)
                ),
                reply_of=lambda opened: opened[0],
                deadline_s=self.timeout_s,
            )
        except BaseException:
            quota.settle(0)
            raise
        telemetry.routed(trace, trace.client)
        chunks = self._rest(first, stream)
        if gated:
            chunks = self.gate.guard_stream(chunks)
        return metered_stream(_observed(chunks, telemetry), quota), trace

    async def _open_stream(
        self,
        handle: DeploymentHandle,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        traceparent: str | None,
    ) -> tuple[Reply, DeploymentResponseGenerator]:
        """Start generation and wait for the first chunk: until then the edge may fail over and
        errors still get a real status; after it, they become an error event."""
        stream = handle.options(stream=True).stream.remote(messages, params, traceparent)
        try:
            return await stream.__anext__(), stream
        except BaseException:
            stream.cancel()
            raise

    async def _rest(
        self, first: Reply, stream: DeploymentResponseGenerator
    ) -> AsyncIterator[GenerationChunk]:
        chunk: GenerationChunk = first.value
        try:
            while True:
                yield chunk
                if chunk.finish_reason is not None:
                    return
                chunk = (await stream.__anext__()).value
        finally:
            stream.cancel()  # the client left or the stream ended: free the model's slot

    # ---- health and catalogue -----------------------------------------------------------

    @app.get("/healthz")
    async def healthz(self) -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz(self) -> dict[str, Any]:
        status = await asyncio.to_thread(serve.status)
        deployments = status.applications[serve.get_replica_context().app_name].deployments
        by_model: dict[str, dict[str, Any]] = {name: {} for name in self.models}
        for deployment, (model, region) in self.config.model_deployments().items():
            status = deployments[deployment]
            by_model[model][region] = {
                "status": str(status.status.value),
                "running_replicas": status.replica_states.get("RUNNING", 0),
            }
        models = {
            name: {
                "running_replicas": sum(r["running_replicas"] for r in regions.values()),
                "regions": regions,
                "last_cold_start": self.pools.last_cold_start.get(name),
            }
            for name, regions in by_model.items()
        }
        ready = [name for name, m in models.items() if m["running_replicas"] > 0]
        return {"ready": ready, "models": models}

    @app.get("/v1/models", response_model=ModelList)
    async def list_models(self, principal: Caller) -> ModelList:
        return ModelList(
            data=[
                ModelCard(id=m.name, created=self.created, task=m.task, family=m.family)
                for m in self.models.values()
            ]
        )

    # ---- OpenAI-compatible API ----------------------------------------------------------

    @app.post("/v1/chat/completions", response_model=ChatCompletion)
    async def chat_completions(
        self, body: ChatCompletionRequest, request: Request, response: Response, principal: Caller
    ) -> Any:
        telemetry = request_telemetry(request)
        telemetry.request(
            task="chat",
            model=body.model,
            stream=body.stream,
            max_tokens=body.effective_max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
            prompt=chat_messages_as_dicts(body),
        )
        model = self._model(body.model, "chat")
        messages, params, quota = self._admit_chat(body, principal)
        if body.stream:
            chunks, trace = await self._generate_stream(model, messages, params, request, quota)
            events = self._openai_chunks(model.name, chunks, body)
            headers = {**trace.headers(), **quota.headers}
            return EventSourceResponse(events, ping=15, headers=headers)
        key, hit, trace = (None, None, None)
        if _is_deterministic(body):
            key, hit, trace = await self._cached("chat", model, body, request, principal.key_id)
        if hit is None:
            done, trace = await self._generate(model, messages, params, request, quota)
            hit = ChatCompletion(
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
        else:
            quota.settle(hit.usage.total_tokens)
            telemetry.usage(
                input_tokens=hit.usage.prompt_tokens,
                output_tokens=hit.usage.completion_tokens,
                finish_reason=hit.choices[0].finish_reason,
            )
        return self._answer(response, trace, quota, key, hit)

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
    async def embeddings(
        self, body: EmbeddingRequest, request: Request, response: Response, principal: Caller
    ) -> CreateEmbeddingResponse:
        model, quota, key, hit, trace = await self._begin_texts(
            "embedding", body, body.texts, request, principal
        )
        if hit is None:
            reply, trace = await self._call_texts(model, body.texts, request, quota)
            result = reply.value
            dimension = result.vectors.shape[1]
            if body.dimensions is not None and body.dimensions != dimension:
                raise InvalidRequestError(
                    f"{model.name!r} returns {dimension}-dimensional vectors; "
                    f"dimensions={body.dimensions} is not available",
                    param="dimensions",
                )
            hit = CreateEmbeddingResponse(
                data=[
                    Embedding.from_vector(i, vector, body.encoding_format)
                    for i, vector in enumerate(result.vectors)
                ],
                model=model.name,
                usage=EmbeddingUsage(
                    prompt_tokens=result.total_tokens, total_tokens=result.total_tokens
                ),
            )
        quota.settle(hit.usage.total_tokens)
        request_telemetry(request).usage(input_tokens=hit.usage.prompt_tokens)
        return self._answer(response, trace, quota, key, hit)

    @app.post("/v1/moderations", response_model=ModerationCreateResponse)
    async def moderations(
        self, body: ModerationRequest, request: Request, response: Response, principal: Caller
    ) -> ModerationCreateResponse:
        model, quota, key, hit, trace = await self._begin_texts(
            "moderation", body, body.texts, request, principal
        )
        if hit is None:
            reply, trace = await self._call_texts(model, body.texts, request, quota)
            hit = ModerationCreateResponse(
                id=moderation_id(),
                model=model.name,
                results=[
                    Moderation.from_scores(r.category_scores, r.categories) for r in reply.value
                ],
            )
        request_telemetry(request).flagged(
            name for result in hit.results for name, on in result.categories.items() if on
        )
        return self._answer(response, trace, quota, key, hit)

    # ---- Workers-AI-style API -----------------------------------------------------------

    @app.post("/ai/run/{model_name}")
    async def run_model(
        self, model_name: str, body: Annotated[dict[str, Any], Body()], request: Request
    ) -> Any:
        """Run any model with its task's natural input; answers in a Workers-AI envelope."""
        try:
            principal = authenticated(request)
            model = self.models.get(model_name)
            if model is None:
                raise ModelNotFoundError(f"the model {model_name!r} does not exist", param="model")
            request_telemetry(request).request(task=model.task, model=model.name)
            try:
                task_input = WORKERS_INPUT_BY_TASK[model.task].model_validate(body)
            except ValidationError as exc:
                raise request_error_from_validation(exc.errors()) from None
            return await self._run_task(model, task_input, request, principal)
        except ServingError as error:
            return JSONResponse(
                error_envelope(error.status, error.message), error.status, error_headers(error)
            )

    async def _run_task(
        self, model: ServedModel, task_input: Any, request: Request, principal: Principal
    ) -> Any:
        if model.task == "chat":
            chat = workers_chat_to_chat_request(model.name, task_input)
            messages, params, quota = self._admit_chat(chat, principal)
            if chat.stream:
                chunks, trace = await self._generate_stream(model, messages, params, request, quota)
                headers = {**trace.headers(), **quota.headers}
                return EventSourceResponse(self._workers_chunks(chunks), ping=15, headers=headers)
            done, trace = await self._generate(model, messages, params, request, quota)
            usage = Usage.from_counts(done.prompt_tokens, done.completion_tokens)
            result: Any = WorkersChatResult(response=done.text, usage=usage)
        else:
            quota = self._admit_texts(task_input.texts, principal)
            reply, trace = await self._call_texts(model, task_input.texts, request, quota)
            if model.task == "embedding":
                quota.settle(reply.value.total_tokens)
                result = WorkersEmbeddingResult.from_vectors(reply.value.vectors)
            else:
                result = [
                    Moderation.from_scores(r.category_scores, r.categories) for r in reply.value
                ]
        return JSONResponse(ok_envelope(result), headers={**trace.headers(), **quota.headers})

    async def _workers_chunks(self, chunks: AsyncIterator[GenerationChunk]) -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield WorkersChatResult(response=chunk.text).model_dump_json()
        except Exception as exc:  # noqa: BLE001 - after the first byte an error is an event
            error = as_serving_error(exc)
            yield JSONResponse(error_envelope(error.status, error.message)).body.decode()
        yield DONE

    # ---- admin API (fault drills) -------------------------------------------------------

    def _require_admin(self, request: Request) -> None:
        self.keys.authorize_admin(request.headers.get("authorization"), request.url.path)

    @app.get("/admin/colos", include_in_schema=False)
    async def admin_colos(self, request: Request) -> list[dict[str, Any]]:
        self._require_admin(request)
        if self._control is not None:
            await self._sync_faults()
        return self.network.colo_states()

    @app.post("/admin/colos/{colo_id}/faults", include_in_schema=False)
    async def admin_set_fault(
        self, colo_id: str, fault: ColoFault, request: Request
    ) -> dict[str, Any]:
        self._require_admin(request)
        colo = self._known_colo(colo_id)
        if self._control is None:
            self.network.set_fault(colo, fault)
        else:
            await self._control.set_fault.remote(colo, fault.model_dump(mode="json"))
            await self._sync_faults()
        return self._colo_state(colo)

    @app.delete("/admin/colos/{colo_id}/faults", include_in_schema=False)
    async def admin_clear_faults(self, colo_id: str, request: Request) -> dict[str, Any]:
        self._require_admin(request)
        colo = self._known_colo(colo_id)
        if self._control is None:
            self.network.clear_faults(colo)
        else:
            await self._control.clear_faults.remote(colo)
            await self._sync_faults()
        return self._colo_state(colo)

    @app.get("/admin/regions", include_in_schema=False)
    async def admin_regions(self, request: Request) -> list[dict[str, Any]]:
        """Per region: replicas running/wanted per model, health, back-pressure, drills."""
        self._require_admin(request)
        if self._control is None:
            return []
        regions: list[dict[str, Any]] = await self._control.regions.remote()
        return regions

    @app.post("/admin/regions/{region}/faults", include_in_schema=False)
    async def admin_set_region_fault(
        self, region: str, fault: ColoFault, request: Request
    ) -> list[dict[str, Any]]:
        """A region drill: its replicas fail (or slow) the requests that reach them."""
        self._require_admin(request)
        if self._control is not None:
            await self._control.set_region_fault.remote(
                self._known_region(region), fault.model_dump(mode="json")
            )
        return await self.admin_regions(request)

    @app.delete("/admin/regions/{region}/faults", include_in_schema=False)
    async def admin_clear_region_faults(
        self, region: str, request: Request
    ) -> list[dict[str, Any]]:
        self._require_admin(request)
        if self._control is not None:
            await self._control.clear_region_faults.remote(self._known_region(region))
        return await self.admin_regions(request)

    def _known_region(self, region: str) -> str:
        if region not in self.config.edge.region_names:
            raise ModelNotFoundError(
                f"unknown region {region!r}", param="region", code="region_not_found"
            )
        return region

    def _known_colo(self, colo_id: str) -> str:
        colo = colo_id.upper()
        if colo not in self.network.topology.ids:
            raise ModelNotFoundError(
                f"unknown colo {colo_id!r}", param="colo_id", code="colo_not_found"
            )
        return colo

    def _colo_state(self, colo: str) -> dict[str, Any]:
        return next(state for state in self.network.colo_states() if state["id"] == colo)
