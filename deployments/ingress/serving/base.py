"""What every model service's request path goes through, written once (`ModelService.serve`):
the admitted request looked up in the cache (a hit answered by the nearest colo), else dispatched
through the edge and its reply made the answer (and stored); the key's tokens settled in a
`finally` with what it really used, however it ended; then its usage told to the telemetry. A
service admits, builds its model call, and fills in the steps that are its own (`_answer`,
`_used_tokens`, `_report_usage`, and `_dispatch` where a gate stands before the model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from pydantic import BaseModel

from deployments.ingress.edge.calls import AnyCall, CallResult
from deployments.ingress.edge.dispatch import EdgeDispatcher
from deployments.ingress.edge.trace import EdgeTrace
from deployments.ingress.protocol.models import Task
from deployments.ingress.security import Reservation
from deployments.ingress.serving.admission import Admission
from deployments.ingress.serving.answer import Answer
from deployments.ingress.serving.caching import NOT_CACHED, CachedAnswers
from deployments.ingress.serving.context import RequestContext
from deployments.ingress.serving.models import ModelCatalogue, ServedModel
from deployments.observability import RequestTelemetry


class Admitted(Protocol):
    """What admission gives every request (AdmittedChat, AdmittedTexts)."""

    @property
    def model(self) -> ServedModel: ...  # the key's fallback model when its budget is spent

    @property
    def quota(self) -> Reservation: ...  # the key's rate-limit reservation, to settle

    @property
    def fallback(self) -> bool: ...  # served by the fallback: its answer is not the cache's


Asked = TypeVar("Asked", bound=BaseModel)  # the request, as the API's protocol types it
Admits = TypeVar("Admits", bound=Admitted)  # what the service's admission gives
T = TypeVar("T")  # the answer the service returns (and caches)


@dataclass(frozen=True)
class ModelService(Generic[Asked, Admits, T]):
    catalogue: ModelCatalogue
    admission: Admission
    cached: CachedAnswers
    edge: EdgeDispatcher

    task: ClassVar[Task]  # the catalogue's task the service serves, and its cache's endpoint

    async def serve(
        self,
        asked: Asked,
        ctx: RequestContext,
        admitted: Admits,
        call: AnyCall,
        *,
        cacheable: bool,
    ) -> Answer[T]:
        """The answer to an admitted request: cached if `cacheable` (and not a fallback's), else
        `call` through the edge; the key's tokens settled however it ends."""
        model, quota = admitted.model, admitted.quota
        used_tokens, cached = 0, NOT_CACHED
        try:
            cacheable = cacheable and not admitted.fallback
            cached = await self.cached.lookup(self.task, asked, ctx, cacheable=cacheable)
            if cached.hit is not None:
                # A waiter (JOINED) gets the first's answer as it reaches the colo, whose RTT
                # the first slept before its model call: the waiter's own RTT is not slept
                # again after the answer, only what its wait has not covered.
                answer = cached.hit
                trace = await self.edge.nearest(model.name, ctx, waited_s=cached.waited_s)
                cached.served(trace)
            else:
                result, trace = await self._dispatch(admitted, ctx, call)
                answer = await self._answer(asked, admitted, result.reply.value, ctx)
                cached.store(answer, trace, whole=self._whole(answer, ctx))
            used_tokens = self._used_tokens(answer, quota)
        finally:
            quota.settle(used_tokens)
            cached.release()  # waiters for an answer it could not share look again
        self._report_usage(answer, ctx.telemetry)
        return Answer.of(answer, trace, quota)

    async def _dispatch(
        self, admitted: Admits, ctx: RequestContext, call: AnyCall
    ) -> tuple[CallResult, EdgeTrace]:
        """`call` through the edge to the admitted model."""
        return await self.edge.dispatch(admitted.model.name, ctx, call)

    async def _answer(self, asked: Asked, admitted: Admits, reply: Any, ctx: RequestContext) -> T:
        """The model's reply as the answer the service returns and caches."""
        raise NotImplementedError

    def _whole(self, answer: T, ctx: RequestContext) -> bool:
        """Whether the answer is whole, so it may be cached and shared (not cut short, nor
        unchecked where a check was due)."""
        return True

    def _used_tokens(self, answer: T, quota: Reservation) -> int:
        """The tokens the request really used, which its key's reservation is settled with."""
        raise NotImplementedError

    def _report_usage(self, answer: T, telemetry: RequestTelemetry) -> None:
        """Tell the request's telemetry what the answer used."""
