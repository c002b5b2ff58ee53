"""The router's coalescing of concurrent text-model calls (deployments.ingress.edge.coalesce), in
the text models' typed clients on fake handles and one event loop: a lone call leaves at once;
calls made while the pool's calls are all out leave together as one grouped call, each answered
with its own reply or error; a failure of the whole call reaches every request in it; a request
abandoned while queued is not sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from benchmarks.lib.fake_handles import Method, app_config
from deployments.config import CoalesceConfig
from deployments.contracts.chat_deployment import ChatClient
from deployments.contracts.embedding_deployment import EmbeddingClient, EmbedRequest
from deployments.contracts.moderation_deployment import ClassifyRequest, ModerationClient
from deployments.errors import InvalidRequestError, QueueFullError
from deployments.ingress.edge.clients import model_clients
from deployments.ingress.edge.coalesce import CallGroups, coalescer


class GroupedHandle:
    """`embed_many.remote(requests)` (and `classify_many`) answers after `release` is set: each
    request's text upper-cased, or an InvalidRequestError for an empty one; `fail` fails the whole
    call. `groups`: each grouped call's texts; one-request methods are recorded in `single`."""

    def __init__(self) -> None:
        self.groups: list[list[str]] = []
        self.release = asyncio.Event()
        self.fail: BaseException | None = None
        self.embed_many = self.classify_many = Method(self._answer)
        self.single: list[str] = []
        self.embed = self.classify = Method(self._single)
        self.wake = Method(self._woken)

    async def _answer(self, requests: list[Any]) -> list[Any]:
        self.groups.append([request.texts[0] for request in requests])
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [
            InvalidRequestError("empty", param="input") if not text else text.upper()
            for text in self.groups[-1]
        ]

    async def _single(self, request: Any) -> str:
        self.single.append(request.texts[0])
        return request.texts[0].upper()

    async def _woken(self) -> str:
        return "woken"


def embedding_client(fake: GroupedHandle, config: CoalesceConfig) -> EmbeddingClient:
    return EmbeddingClient(fake, coalescer(config))  # type: ignore[arg-type]


def embed(client: EmbeddingClient, text: str) -> Any:
    return client.embed(EmbedRequest([text]))


async def settle() -> None:
    """Let every ready task run (no timing involved: the loop is only asked to go round)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_a_lone_call_leaves_at_once_and_calls_meanwhile_leave_together() -> None:
    async def scenario() -> tuple[list[Any], list[list[str]]]:
        fake = GroupedHandle()
        client = embedding_client(fake, CoalesceConfig(max_calls_in_flight=1))
        first = embed(client, "a")
        await settle()
        assert fake.groups == [["a"]]  # sent without waiting for company
        rest = [embed(client, text) for text in ("b", "c", "d")]
        await settle()
        assert len(fake.groups) == 1  # the one call allowed is out: the others queue
        fake.release.set()
        answers = await asyncio.gather(first, *rest)
        return answers, fake.groups

    answers, groups = asyncio.run(scenario())
    assert answers == ["A", "B", "C", "D"]
    assert groups == [["a"], ["b", "c", "d"]]


def test_each_request_gets_its_own_error_and_a_group_is_capped() -> None:
    async def scenario() -> tuple[list[Any], list[int]]:
        fake = GroupedHandle()
        config = CoalesceConfig(max_calls_in_flight=1, max_requests_per_call=2)
        client = embedding_client(fake, config)
        calls = [embed(client, text) for text in ("a", "", "c", "d")]
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
        client = embedding_client(fake, CoalesceConfig(max_calls_in_flight=1))
        calls = [embed(client, text) for text in ("a", "b", "c")]
        fake.release.set()
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run(scenario())
    assert all(isinstance(answer, QueueFullError) for answer in answers)


def test_a_request_abandoned_while_queued_is_not_sent() -> None:
    async def scenario() -> list[list[str]]:
        fake = GroupedHandle()
        client = embedding_client(fake, CoalesceConfig(max_calls_in_flight=1))
        first = embed(client, "a")
        await settle()
        gone, kept = embed(client, "b"), embed(client, "c")
        gone.cancel()  # its client went away (a deadline, a disconnect)
        fake.release.set()
        assert await asyncio.gather(first, kept) == ["A", "C"]
        return fake.groups

    assert asyncio.run(scenario()) == [["a"], ["c"]]


def test_a_moderation_client_groups_classify_calls_into_classify_many() -> None:
    async def scenario() -> tuple[list[Any], list[list[str]], list[str]]:
        fake = GroupedHandle()
        client = ModerationClient(fake, coalescer(CoalesceConfig(max_calls_in_flight=1)))  # type: ignore[arg-type]
        calls = [client.classify(ClassifyRequest([text])) for text in ("a", "b", "c")]
        fake.release.set()
        return await asyncio.gather(*calls), fake.groups, fake.single

    answers, groups, single = asyncio.run(scenario())
    assert answers == ["A", "B", "C"]
    assert groups == [["a"], ["b", "c"]] and single == []


def test_text_clients_coalesce_when_on_and_call_the_one_request_method_when_off() -> None:
    fake, chat = GroupedHandle(), GroupedHandle()
    handles = {"embedding": {"eu": fake}, "glm": {"eu": chat}}

    async def scenario(coalesce: dict[str, Any]) -> tuple[Any, Any]:
        clients = model_clients(app_config(coalesce=coalesce), handles)  # type: ignore[arg-type]
        assert isinstance(clients["glm"]["eu"], ChatClient)
        client = clients["embedding"]["eu"]
        assert isinstance(client, EmbeddingClient)
        fake.release.set()
        return await embed(client, "x"), await client.wake()

    assert asyncio.run(scenario({})) == ("X", "woken")
    assert fake.groups == [["x"]] and fake.single == []
    assert asyncio.run(scenario({"enabled": False})) == ("X", "woken")
    assert fake.groups == [["x"]] and fake.single == ["x"]  # straight to `embed`


def test_coalescing_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_calls_in_flight"):
        CoalesceConfig(max_calls_in_flight=0)
    with pytest.raises(ValueError, match="max_requests"):
        CoalesceConfig.model_validate({"max_requests": 8})


def test_past_the_waiting_bound_a_request_meets_back_pressure_not_a_queue() -> None:
    """Held in the router without a bound, an overloaded pool's requests would wait out their
    deadline instead of spilling to another region: one past the bound is a QueueFullError, as
    at Serve's own queue, and the requests already waiting are still answered."""

    async def scenario() -> tuple[list[Any], list[list[str]]]:
        fake = GroupedHandle()
        config = CoalesceConfig(max_calls_in_flight=1, max_waiting_requests=2)
        client = embedding_client(fake, config)
        calls = [embed(client, text) for text in ("a", "b", "c", "d")]
        await settle()
        fake.release.set()
        answers = await asyncio.gather(*calls, return_exceptions=True)
        later = await embed(client, "e")  # the queue drained: room again
        return [*answers, later], fake.groups

    answers, groups = asyncio.run(scenario())
    assert answers[:3] == ["A", "B", "C"] and answers[4] == "E"
    assert isinstance(answers[3], QueueFullError) and answers[3].retry_after_s == 1
    assert groups == [["a"], ["b", "c"], ["e"]]


def test_a_refusal_retries_after_a_grouped_calls_time_as_lately_measured() -> None:
    """The queue drains one group per call back: a refused request retries about one call's
    time later (an EWMA of the calls timed), not a fixed second."""
    now = [0.0]

    async def scenario() -> list[float]:
        release = asyncio.Event()

        async def send_group(requests: list[str]) -> list[Any]:
            await release.wait()
            now[0] += 0.3  # each grouped call takes 0.3 s on the clock
            return list(requests)

        groups: CallGroups[str, Any] = CallGroups(
            send_group,
            CoalesceConfig(max_calls_in_flight=1, max_waiting_requests=1),
            lambda: now[0],
        )
        hints = []
        for _ in range(2):
            release.clear()
            first, second, refused = (groups.submit(text) for text in ("a", "b", "c"))
            with pytest.raises(QueueFullError) as caught:
                await refused
            hints.append(caught.value.retry_after_s)
            release.set()
            await asyncio.gather(first, second)
        return hints

    assert asyncio.run(scenario()) == pytest.approx([1.0, 0.3])  # untimed yet; then measured
