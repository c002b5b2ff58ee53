"""The router's coalescing of concurrent text-model calls (deployments.ingress.edge.coalesce), on
fake handles and one event loop: a lone call leaves at once; calls made while the pool's calls are
all out leave together as one grouped call, each answered with its own reply or error; a failure of
the whole call reaches every request in it; a request abandoned while queued is not sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from deployments.config import CoalesceConfig
from deployments.errors import InvalidRequestError, QueueFullError
from deployments.ingress.edge.coalesce import CoalescingHandle, coalescing


class GroupedHandle:
    """`embed_many.remote(requests)` answers after `release` is set: each request's text
    upper-cased, or an InvalidRequestError for an empty one; `fail` fails the whole call."""

    def __init__(self) -> None:
        self.groups: list[list[tuple[Any, ...]]] = []
        self.release = asyncio.Event()
        self.fail: BaseException | None = None
        self.embed_many = self
        self.woken = 0

    def remote(self, requests: list[tuple[Any, ...]]) -> Any:
        self.groups.append(list(requests))
        return self._answer(requests)

    async def _answer(self, requests: list[tuple[Any, ...]]) -> list[Any]:
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [
            InvalidRequestError("empty", param="input") if not text else text.upper()
            for (text,) in requests
        ]

    def wake(self) -> str:
        self.woken += 1
        return "woken"


async def settle() -> None:
    """Let every ready task run (no timing involved: the loop is only asked to go round)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_lone_call_leaves_at_once_and_calls_meanwhile_leave_together() -> None:
    async def scenario() -> tuple[list[Any], list[list[tuple[Any, ...]]]]:
        fake = GroupedHandle()
        handle = CoalescingHandle(fake, CoalesceConfig(max_calls_in_flight=1))
        first = handle.embed.remote("a")
        await settle()
        assert fake.groups == [[("a",)]]  # sent without waiting for company
        rest = [handle.embed.remote(text) for text in ("b", "c", "d")]
        await settle()
        assert len(fake.groups) == 1  # the one call allowed is out: the others queue
        fake.release.set()
        answers = await asyncio.gather(first, *rest)
        return answers, fake.groups

    answers, groups = asyncio.run(scenario())
    assert answers == ["A", "B", "C", "D"]
    assert groups == [[("a",)], [("b",), ("c",), ("d",)]]


def test_each_request_gets_its_own_error_and_a_group_is_capped() -> None:
    async def scenario() -> tuple[list[Any], list[int]]:
        fake = GroupedHandle()
        config = CoalesceConfig(max_calls_in_flight=1, max_requests_per_call=2)
        handle = CoalescingHandle(fake, config)
        calls = [handle.embed.remote(text) for text in ("a", "", "c", "d")]
        fake.release.set()
        answers = await asyncio.gather(*calls, return_exceptions=True)
        return answers, [len(group) for group in fake.groups]

    answers, sizes = asyncio.run(scenario())
    assert answers[0] == "A" and answers[2:] == ["C", "D"]
    assert isinstance(answers[1], InvalidRequestError)
    assert sizes == [1, 2, 1]  # the first alone, then at most two at a time


def test_a_failure_of_the_whole_call_reaches_every_request_in_it() -> None:
    async def scenario() -> list[Any]:
        fake = GroupedHandle()
        fake.fail = QueueFullError("the model's queue is full", retry_after_s=1)
        handle = CoalescingHandle(fake, CoalesceConfig(max_calls_in_flight=1))
        calls = [handle.embed.remote(text) for text in ("a", "b", "c")]
        fake.release.set()
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(scenario())
    assert all(isinstance(answer, QueueFullError) for answer in answers)


def test_a_request_abandoned_while_queued_is_not_sent() -> None:
    async def scenario() -> list[list[tuple[Any, ...]]]:
        fake = GroupedHandle()
        handle = CoalescingHandle(fake, CoalesceConfig(max_calls_in_flight=1))
        first = handle.embed.remote("a")
        await settle()
        gone, kept = handle.embed.remote("b"), handle.embed.remote("c")
        gone.cancel()  # its client went away (a deadline, a disconnect)
        fake.release.set()
        assert await asyncio.gather(first, kept) == ["A", "C"]
        return fake.groups

    assert asyncio.run(scenario()) == [[("a",)], [("c",)]]


def test_other_methods_are_the_handles_own_and_chat_handles_are_left_alone() -> None:
    fake, chat = GroupedHandle(), object()
    handles = {"embedding": {"eu": fake}, "glm": {"eu": chat}}
    wrapped = coalescing(handles, {"embedding"}, CoalesceConfig())
    assert isinstance(wrapped["embedding"]["eu"], CoalescingHandle)
    assert wrapped["embedding"]["eu"].wake() == "woken" and fake.woken == 1
    assert wrapped["glm"]["eu"] is chat
    off = coalescing(handles, {"embedding"}, CoalesceConfig(enabled=False))
    assert off["embedding"]["eu"] is fake


def test_coalescing_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_calls_in_flight"):
        CoalesceConfig(max_calls_in_flight=0)
    with pytest.raises(ValueError, match="max_requests"):
        CoalesceConfig.model_validate({"max_requests": 8})


def test_past_the_waiting_bound_a_request_meets_back_pressure_not_a_queue() -> None:
    """Held in the router without a bound, an overloaded pool's requests would wait out their
    deadline instead of spilling to another region: one past the bound is a QueueFullError, as
    at Serve's own queue, and the requests already waiting are still answered."""

    async def scenario() -> tuple[list[Any], list[list[tuple[Any, ...]]]]:
        fake = GroupedHandle()
        config = CoalesceConfig(max_calls_in_flight=1, max_waiting_requests=2)
        handle = CoalescingHandle(fake, config)
        calls = [handle.embed.remote(text) for text in ("a", "b", "c", "d")]
        await settle()
        fake.release.set()
        answers = await asyncio.gather(*calls, return_exceptions=True)
        later = await handle.embed.remote("e")  # the queue drained: room again
        return [*answers, later], fake.groups

    answers, groups = asyncio.run(scenario())
    assert answers[:3] == ["A", "B", "C"] and answers[4] == "E"
    assert isinstance(answers[3], QueueFullError) and answers[3].retry_after_s == 1
    assert groups == [[("a",)], [("b",), ("c",)], [("e",)]]
