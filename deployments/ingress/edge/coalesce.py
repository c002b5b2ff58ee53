"""Concurrent calls of one method on one model pool, sent as one grouped call
(`EmbeddingClient.embed_many`, `ModerationClient.classify_many`): Ray Serve's cost per
call (the handle's routing, the replica's request machinery, both event-loop hops) is paid once
per group instead of once per request; the replica runs the group as one entry of its batch.

A call goes out at once while fewer than `max_calls_in_flight` groups are out, so a lone client
never waits; calls that come while the pool's calls are all out queue and leave together, up to
`max_requests_per_call`, as soon as one comes back. At most `max_waiting_requests` wait: one more
is back-pressure (QueueFullError), as Serve's own queue answers, so an overloaded pool still
spills to another region or sheds with Retry-After instead of holding requests in the router
until their deadline. The replica still counts every request for its autoscaler
(`deployments.replica.batched`, `deployments.control.autoscale`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from deployments.config import CoalesceConfig
from deployments.contracts.model_deployment import Coalescer, GroupedReplies
from deployments.contracts.replies import Reply
from deployments.errors import QueueFullError, ServingError

RequestT = TypeVar("RequestT")
T = TypeVar("T")
# A refused request retries when the queue drains enough: the next grouped call back sends up to
# max_requests_per_call of the waiting ones. Until a call was timed, this.
UNTIMED_RETRY_S = 1.0
_CALL_TIME_WEIGHT = 0.3  # an EWMA of the grouped calls' durations


class CallGroups(Generic[RequestT, T]):
    """The queue of one (pool, method): `submit(request)` returns the awaitable of that request's
    own reply; a ServingError of that request alone is raised to it alone, a failure of the
    whole call (back-pressure, a dead replica) to every request in it."""

    def __init__(
        self,
        send_group: Callable[[list[RequestT]], Awaitable[GroupedReplies[T]]],
        config: CoalesceConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send_group = send_group
        self._config = config
        self._clock = clock
        self._queue: list[tuple[RequestT, asyncio.Future[Reply[T]]]] = []
        self._in_flight = 0
        self._call_s: float | None = None  # how long a grouped call takes lately

    def drain_s(self) -> float:
        """When a refused request is expected to find room: one grouped call's time, as the
        queue drains a group per call back (calls in flight end about that far apart or less)."""
        return UNTIMED_RETRY_S if self._call_s is None else self._call_s

    def submit(self, request: RequestT) -> asyncio.Future[Reply[T]]:
        future: asyncio.Future[Reply[T]] = asyncio.get_running_loop().create_future()
        all_out = self._in_flight >= self._config.max_calls_in_flight
        if all_out and len(self._queue) >= self._config.max_waiting_requests:
            future.set_exception(
                QueueFullError(
                    "the model's queue is full; retry shortly", retry_after_s=self.drain_s()
                )
            )
            return future
        self._queue.append((request, future))
        self._send_what_fits()
        return future

    def _send_what_fits(self) -> None:
        while self._queue and self._in_flight < self._config.max_calls_in_flight:
            size = self._config.max_requests_per_call
            group, self._queue = self._queue[:size], self._queue[size:]
            # A request whose client went away while it queued is not sent.
            group = [(request, future) for request, future in group if not future.done()]
            if not group:
                continue
            self._in_flight += 1
            asyncio.get_running_loop().create_task(self._send(group))

    async def _send(self, group: list[tuple[RequestT, asyncio.Future[Reply[T]]]]) -> None:
        started_at = self._clock()
        try:
            answers = await self._send_group([request for request, _ in group])
            self._timed(self._clock() - started_at)
        except BaseException as exc:  # noqa: BLE001 - each request's caller maps it (ModelCall.run)
            for _, future in group:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, future), answer in zip(group, answers, strict=True):
                if future.done():
                    continue
                if isinstance(answer, ServingError):
                    future.set_exception(answer)
                else:
                    future.set_result(answer)
        finally:
            self._in_flight -= 1
            self._send_what_fits()

    def _timed(self, call_s: float) -> None:
        previous = self._call_s
        self._call_s = (
            call_s
            if previous is None
            else (1 - _CALL_TIME_WEIGHT) * previous + _CALL_TIME_WEIGHT * call_s
        )


def coalescer(config: CoalesceConfig) -> Coalescer:
    """What a text model's client groups its one-request calls with: a CallGroups queue per
    (pool, method)."""

    def grouped(
        send_group: Callable[[list[Any]], Awaitable[GroupedReplies[Any]]],
    ) -> Callable[[Any], Awaitable[Reply[Any]]]:
        return CallGroups(send_group, config).submit

    return grouped
