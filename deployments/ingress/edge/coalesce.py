"""Concurrent calls of one method on one model pool, sent as one handle call: Ray Serve's cost per
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
from collections.abc import Mapping
from typing import Any

from deployments.config import CoalesceConfig
from deployments.errors import QueueFullError, ServingError

Handle = Any  # a DeploymentHandle (or a test double with the same methods)

# A text model's methods that take one request, and their grouped forms on the same replica:
# `<method>_many(list of argument tuples)` answers a list of replies or ServingErrors, in order.
GROUPED_METHODS: Mapping[str, str] = {"embed": "embed_many", "classify": "classify_many"}


class CallGroups:
    """The queue of one (pool, method): `submit(*args)` returns the awaitable of that request's
    own reply; a ServingError of that request alone is raised to it alone, a failure of the
    whole call (back-pressure, a dead replica) to every request in it."""

    def __init__(self, handle: Handle, grouped_method: str, config: CoalesceConfig) -> None:
        self._handle = handle
        self._grouped_method = grouped_method
        self._config = config
        self._queue: list[tuple[tuple[Any, ...], asyncio.Future[Any]]] = []
        self._in_flight = 0

    def submit(self, *args: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        all_out = self._in_flight >= self._config.max_calls_in_flight
        if all_out and len(self._queue) >= self._config.max_waiting_requests:
            future.set_exception(
                QueueFullError("the model's queue is full; retry shortly", retry_after_s=1)
            )
            return future
        self._queue.append((args, future))
        self._send_what_fits()
        return future

    def _send_what_fits(self) -> None:
        while self._queue and self._in_flight < self._config.max_calls_in_flight:
            size = self._config.max_requests_per_call
            group, self._queue = self._queue[:size], self._queue[size:]
            # A request whose client went away while it queued is not sent.
            group = [(args, future) for args, future in group if not future.done()]
            if not group:
                continue
            self._in_flight += 1
            asyncio.get_running_loop().create_task(self._send(group))

    async def _send(self, group: list[tuple[tuple[Any, ...], asyncio.Future[Any]]]) -> None:
        try:
            method = getattr(self._handle, self._grouped_method)
            answers = await method.remote([args for args, _ in group])
        except BaseException as exc:  # noqa: BLE001 - each request's caller maps it (HandleCall.run)
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


class _GroupedMethod:
    """`handle.<method>` with `.remote(*args)`, as a DeploymentHandle's method has."""

    def __init__(self, groups: CallGroups) -> None:
        self._groups = groups

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        return self._groups.submit(*args)


class CoalescingHandle:
    """A model pool's handle whose grouped methods (GROUPED_METHODS) coalesce; every other
    attribute (wake, describe, options, ...) is the handle's own."""

    def __init__(self, handle: Handle, config: CoalesceConfig) -> None:
        self._handle = handle
        self._methods = {
            method: _GroupedMethod(CallGroups(handle, grouped, config))
            for method, grouped in GROUPED_METHODS.items()
        }

    def __getattr__(self, name: str) -> Any:
        methods = self.__dict__.get("_methods", {})
        if name in methods:
            return methods[name]
        return getattr(self.__dict__["_handle"], name)


def coalescing(
    handles: Mapping[str, Mapping[str, Handle]], text_models: set[str], config: CoalesceConfig
) -> dict[str, dict[str, Handle]]:
    """`handles` (model -> region -> handle) with the text models' handles coalescing (when
    `config.enabled`); chat handles as they are."""
    return {
        model: {
            region: CoalescingHandle(handle, config)
            if config.enabled and model in text_models
            else handle
            for region, handle in by_region.items()
        }
        for model, by_region in handles.items()
    }
