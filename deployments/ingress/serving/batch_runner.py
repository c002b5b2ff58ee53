"""Each router replica's batch runner: it claims a queued job whose model has a free warm
replica somewhere (deployments.ingress.state.batch_jobs: one replica holds a job at a time, under a
lease) and runs its items through the same path as `/ai/run`
(deployments.ingress.serving.workers_ai), in the submitting key's name, at most `max_in_flight` at
once.

Interactive traffic comes first, and a batch never wakes a cold region: a job is claimed only
for a model warm and without back-pressure in some region (the pools' shared state, the one
`rejectIfBusy` reads), and its items carry the `BACKGROUND` wait limits, so the edge takes only
a free warm replica and wakes nothing. An item refused for capacity (busy, queue full, the
key's rate limit) is not an answer: the job goes back to `queued` and the runner backs off for
`poll_interval_s`. Any other error is that item's answer (`success: false`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson

from deployments.config.state import BatchConfig
from deployments.errors import (
    AuthenticationError,
    BudgetExceededError,
    BusyError,
    QueueFullError,
    RateLimitedError,
    ServingError,
)
from deployments.ingress.edge.pools import RegionPools
from deployments.ingress.edge.waiting import BACKGROUND
from deployments.ingress.protocol import json_ready
from deployments.ingress.protocol.workers_batch import item_response
from deployments.ingress.security import KeyStore, Principal
from deployments.ingress.serving.context import RequestContext
from deployments.ingress.serving.workers_ai import WorkersRun
from deployments.ingress.state.batch_jobs import BatchItem, BatchJob, BatchJobs
from deployments.ingress.state.database import StoreUnavailable
from deployments.observability import RequestTelemetry, RouterObservability

log = logging.getLogger("ray.serve")
T = TypeVar("T")


def _later(error: ServingError) -> bool:
    """Refused for capacity or the key's rate: retried later, never the item's answer (a spent
    budget is an answer: it renews only at the period's end)."""
    if isinstance(error, BudgetExceededError):
        return False
    return isinstance(error, BusyError | QueueFullError | RateLimitedError)


class BatchRunner:
    def __init__(
        self,
        jobs: BatchJobs,
        workers: WorkersRun,
        pools: RegionPools,
        keys: KeyStore,
        config: BatchConfig,
        *,
        ready: Callable[[], Awaitable[bool]],
        observability: RouterObservability | None = None,
        owner: str | None = None,
        wall_clock: Callable[[], float] = time.time,
    ):
        """`ready`: the database is migrated and answers (GatewayState.ensure_ready)."""
        self._jobs = jobs
        self._workers = workers
        self._pools = pools
        self._keys = keys
        self._config = config
        self._ready = ready
        self._observability = observability
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wall_clock = wall_clock

    async def run_forever(self) -> None:
        while True:
            try:
                progressed = await self.run_once()
            except StoreUnavailable as error:
                log.warning("batch: the database does not answer (%s); retrying", error)
                progressed = False
            except Exception:  # noqa: BLE001 - a bug fails one round, not every later batch
                log.exception("batch: a round of the runner failed")
                progressed = False
            if not progressed:
                await asyncio.sleep(self._config.poll_interval_s)

    def free_models(self) -> list[str]:
        """The served models with a warm replica and no back-pressure in some region now."""
        return [
            model
            for model in self._pools.clients
            if any(view.warm and not view.saturated for view in self._pools.pools(model).values())
        ]

    async def run_once(self) -> bool:
        """Claim one job and run its items while capacity lasts; whether that made progress
        (an item answered, or the job done). False: nothing to do now, back off."""
        if not await self._ready():
            return False
        await self._pools.ready()
        config = self._config
        job = await self._jobs.claim(
            self.owner, self.free_models(), self._wall_clock(), config.lease_s
        )
        if job is None:
            return False
        principal = self._keys.principal_of(job.key_id)
        answered = 0
        while True:
            items = await self._jobs.pending(job.id, config.max_in_flight)
            if not items:
                now = self._wall_clock()
                await self._jobs.finish(job.id, self.owner, now, now + config.result_ttl_s)
                return True
            if job.served_model not in self.free_models():
                await self._jobs.release(job.id, self.owner, self._wall_clock())
                return answered > 0
            responses = await self._holding(
                job, asyncio.gather(*(self._run(job, principal, i) for i in items))
            )
            for item, response in zip(items, responses, strict=True):
                if response is None:
                    continue
                tokens, body = response
                if not await self._jobs.record(
                    job.id, self.owner, item.index, body, tokens, self._wall_clock(), config.lease_s
                ):
                    return answered > 0  # another replica took the job over
                answered += 1
            if any(response is None for response in responses):
                await self._jobs.release(job.id, self.owner, self._wall_clock())
                return answered > 0

    async def _holding(self, job: BatchJob, work: Awaitable[T]) -> T:
        """`work`, with the job's lease renewed meanwhile (an item may outlast a lease)."""

        async def renew() -> None:
            while True:
                await asyncio.sleep(self._config.lease_s / 3)
                with contextlib.suppress(StoreUnavailable):  # the lease may run out: a retake
                    await self._jobs.renew(
                        job.id, self.owner, self._wall_clock(), self._config.lease_s
                    )

        renewing = asyncio.ensure_future(renew())
        try:
            return await work
        finally:
            renewing.cancel()

    async def _run(
        self, job: BatchJob, principal: Principal | None, item: BatchItem
    ) -> tuple[tuple[int, int], dict[str, Any]] | None:
        """One item through `/ai/run`'s path: its tokens and response, or None if capacity
        refused it (run again later)."""
        request_id = f"{job.id}/{item.index}"
        telemetry = self._telemetry(job, request_id)
        try:
            if principal is None:
                raise AuthenticationError(
                    f"the key {job.key_id} that submitted this batch is no longer valid"
                )
            telemetry.authenticated(principal.key_id, principal.collect_payloads)
            given = self._workers.parse(job.model, item.input)
            telemetry.request(task=given.model.task, model=given.model.name)
            ctx = RequestContext(
                principal=principal,
                request_id=request_id,
                traceparent=telemetry.traceparent,
                wait_limits=BACKGROUND,
                telemetry=telemetry,
            )
            answer = await self._workers.run(given, ctx)
        except ServingError as error:
            telemetry.finish(error.status)
            if _later(error):
                return None
            return (0, 0), item_response(item.index, item.external_reference, error=error)
        telemetry.finish(200)
        tokens = (answer.prompt_tokens, answer.completion_tokens)
        return tokens, item_response(item.index, item.external_reference, _plain(answer.result))

    def _telemetry(self, job: BatchJob, request_id: str) -> RequestTelemetry:
        """An item's telemetry, as a request's: metrics, the access log and the key's ledger."""
        if self._observability is None:
            return RequestTelemetry.disabled()
        return self._observability.begin(
            method="POST", path=f"/ai/run/{job.model}", headers={}, request_id=request_id
        )


def _plain(result: Any) -> Any:
    """A result as plain JSON data for the store: float32 vectors as the shortest floats that
    read back the same, as the envelope writes them."""
    return orjson.loads(orjson.dumps(json_ready(result), option=orjson.OPT_SERIALIZE_NUMPY))
