"""The Batch API's submissions and polls: every item checked now, as `/ai/run` checks a request,
and the job kept in the gateway's database, where any router replica's runner takes it
(deployments.ingress.serving.batch_runner) and any replica answers its polls."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

from deployments.errors import (
    BatchExpiredError,
    BatchNotFoundError,
    InvalidRequestError,
    ServingError,
    StateUnavailableError,
)
from deployments.ingress.protocol.workers_batch import (
    EXTERNAL_REFERENCE,
    QUEUE_REQUEST,
    PendingStatus,
    done_result,
    pending_result,
)
from deployments.ingress.serving.admission import check_allowed
from deployments.ingress.serving.context import RequestContext
from deployments.ingress.serving.workers_ai import WorkersRun
from deployments.ingress.state.batch_jobs import BatchItem
from deployments.ingress.state.database import StoreUnavailable
from deployments.ingress.state.gateway import GatewayState

OFF_MESSAGE = (
    "the Batch API (queueRequest) is off on this gateway: it keeps its jobs in the gateway's "
    "database (state.enabled and state.batch.enabled)"
)


class BatchService:
    """`state` None (gateway state off) or its `batch.enabled` off: every batch request is a
    400 saying so (retrying cannot help), not a 503."""

    def __init__(
        self,
        workers: WorkersRun,
        state: GatewayState | None,
        wall_clock: Callable[[], float] = time.time,
    ):
        self._workers = workers
        self._state = state if state is not None and state.config.batch.enabled else None
        self._wall_clock = wall_clock

    async def answer(
        self, model_name: str, body: dict[str, Any], ctx: RequestContext
    ) -> dict[str, Any]:
        """The `result` of a submission (`requests`) or a poll (`request_id`)."""
        state = self._state
        if state is None:
            raise InvalidRequestError(OFF_MESSAGE, code="batch_api_off")
        fields = {name: value for name, value in body.items() if name != QUEUE_REQUEST}
        if set(fields) not in ({"request_id"}, {"requests"}):
            unknown = sorted(set(fields) - {"requests", "request_id"})
            raise InvalidRequestError(
                f"unknown field {unknown[0]!r} in a queued request"
                if unknown
                else "a queued request takes `requests` (a list of inputs, to submit) or "
                "`request_id` (to poll), one of them",
                param=unknown[0] if unknown else "requests",
            )
        try:
            if not await state.ensure_ready():
                raise StoreUnavailable("the schema is not there yet")
            if "request_id" in fields:
                return await self._poll(state, fields["request_id"], ctx)
            return await self._submit(state, model_name, fields["requests"], ctx)
        except StoreUnavailable:
            raise StateUnavailableError(
                "the Batch API needs the gateway's database, which does not answer"
            ) from None

    async def _submit(
        self, state: GatewayState, model_name: str, requests: Any, ctx: RequestContext
    ) -> dict[str, Any]:
        items = self._checked(model_name, requests, state.config.batch.max_requests)
        served = self._workers.catalogue.get(model_name)
        check_allowed(ctx.principal, served)  # refused now, not item by item later
        job_id = str(uuid.uuid4())
        await state.batches.create(
            job_id, ctx.key_id, (model_name, served.name), items, self._wall_clock()
        )
        return pending_result("queued", job_id, model_name)

    def _checked(self, model_name: str, requests: Any, max_requests: int) -> list[BatchItem]:
        """Every item as `/ai/run` would take it (all checked before any is queued); a stream
        is refused, since a batch's answer is polled."""
        if not isinstance(requests, list):
            raise InvalidRequestError("requests: expected a list of inputs", param="requests")
        if not requests:
            raise InvalidRequestError("requests: the list is empty", param="requests")
        if len(requests) > max_requests:
            raise InvalidRequestError(
                f"requests: {len(requests)} inputs, more than the {max_requests} a batch may hold",
                param="requests",
            )
        self._workers.catalogue.get(model_name)  # an unknown model is its 404, once
        items = []
        for index, request in enumerate(requests):
            where = f"requests[{index}]"
            if not isinstance(request, dict):
                raise InvalidRequestError(f"{where}: expected an object", param=where)
            given = {k: v for k, v in request.items() if k != EXTERNAL_REFERENCE}
            try:
                checked = self._workers.parse(model_name, given)
            except ServingError as error:
                raise InvalidRequestError(
                    f"{where}: {error.message}", param=where, code=error.code
                ) from None
            if checked.stream:
                raise InvalidRequestError(
                    f"{where}: stream is not available in a batch (its answer is polled)",
                    param=where,
                )
            items.append(BatchItem(index, given, request.get(EXTERNAL_REFERENCE)))
        return items

    async def _poll(self, state: GatewayState, request_id: Any, ctx: RequestContext) -> Any:
        job = await state.batches.get(request_id) if isinstance(request_id, str) else None
        if job is None or job.key_id != ctx.key_id:  # another key's job is not told apart
            raise BatchNotFoundError(f"no batch job {str(request_id)[:64]!r}", param="request_id")
        if job.expired(self._wall_clock()):
            raise BatchExpiredError(
                f"the results of batch job {job.id} have expired (they are kept "
                f"{state.config.batch.result_ttl_s:g} s after the job is done)",
                param="request_id",
            )
        if job.status != "done":
            status: PendingStatus = "running" if job.status == "running" else "queued"
            return pending_result(status, job.id, job.model)
        results = await state.batches.results(job.id)
        return done_result(
            [r.response for r in results if r.response is not None],
            sum(r.prompt_tokens for r in results),
            sum(r.completion_tokens for r in results),
        )
