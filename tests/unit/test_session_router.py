"""Session affinity: the header a request's session comes in, the handle option it becomes, and
the order in which a session ranks a pool's replicas (rendezvous hashing). The router class in
a real Serve deployment: tests/integration/test_session_affinity.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from deployments.contracts.chat_deployment import ChatClient, ChatRequest
from deployments.contracts.sampling_params import SamplingParams
from deployments.contracts.session_router import (
    FALLBACK_REPLICAS,
    SessionAffinityRouter,
    session_rank,
)
from deployments.errors import BadHeaderValueError
from deployments.ingress.edge.calls import ModelCall, StreamCall
from deployments.ingress.serving.context import MAX_SESSION_CHARS, SESSION_HEADER, session_of


@dataclass(frozen=True)
class FakeReplicaId:
    unique_id: str


@dataclass(frozen=True)
class FakeReplica:
    replica_id: FakeReplicaId


def replicas(*names: str) -> list[Any]:
    return [FakeReplica(FakeReplicaId(name)) for name in names]


def owner(session: str, pool: list[Any]) -> str:
    return str(session_rank(session, pool)[0].replica_id.unique_id)


def test_a_session_ranks_the_replicas_the_same_way_whatever_their_order():
    pool = replicas("a", "b", "c", "d")
    first = session_rank("ses_1", pool)
    assert sorted(r.replica_id.unique_id for r in first) == ["a", "b", "c", "d"]
    assert session_rank("ses_1", list(reversed(pool))) == first


def test_sessions_spread_over_the_replicas():
    pool = replicas("a", "b", "c", "d")
    owners = Counter(owner(f"ses_{i}", pool) for i in range(2000))
    assert set(owners) == {"a", "b", "c", "d"}
    assert min(owners.values()) > 2000 / 4 * 0.8  # within 20% of an even share


def test_a_replica_that_goes_moves_only_its_own_sessions():
    before, after = replicas("a", "b", "c", "d"), replicas("a", "b", "d")
    sessions = [f"ses_{i}" for i in range(1000)]
    moved = [s for s in sessions if owner(s, before) != owner(s, after)]
    assert moved and all(owner(s, before) == "c" for s in moved)
    # and a session's next choice is where it goes: its fallback order holds
    assert all(owner(s, after) == session_rank(s, before)[1].replica_id.unique_id for s in moved)


def test_the_session_header_is_read_and_checked():
    assert session_of({}) == ""
    assert session_of({SESSION_HEADER: "ses_12345678"}) == "ses_12345678"
    for bad in ("x" * (MAX_SESSION_CHARS + 1), "tab\there", "caf\u00e9"):
        with pytest.raises(BadHeaderValueError) as error:
            session_of({SESSION_HEADER: bad})
        assert error.value.param == SESSION_HEADER and error.value.status == 400


class OptionsHandle:
    """A deployment handle that records the options each call was made with."""

    def __init__(self, options: dict[str, Any] | None = None, calls: list[Any] | None = None):
        self.given = options or {}
        self.calls = [] if calls is None else calls

    def options(self, **options: Any) -> OptionsHandle:
        return OptionsHandle({**self.given, **options}, self.calls)

    def __getattr__(self, method: str) -> Any:
        handle = self

        class Method:
            @staticmethod
            def remote(*args: Any) -> Any:
                handle.calls.append((method, handle.given, args))
                return _answer()

        return Method


class _answer:  # noqa: N801 - awaitable, and a stream of one answer, as Serve's responses are
    def __await__(self) -> Any:
        return self.__anext__().__await__()

    async def __anext__(self) -> str:
        return "ok"

    def cancel(self) -> None: ...


def test_a_call_of_a_session_carries_it_to_serve_s_handle_and_one_without_carries_none():
    handle = OptionsHandle()
    client = ChatClient(handle)  # type: ignore[arg-type]
    request = ChatRequest([{"role": "user", "content": "hi"}], SamplingParams())
    asyncio.run(ModelCall(ChatClient.complete_choices, request, session="ses_1").run(client))
    asyncio.run(ModelCall(ChatClient.complete_choices, request).run(client))
    asyncio.run(StreamCall(ChatClient.stream, request, session="ses_1").run(client))
    asyncio.run(StreamCall(ChatClient.stream, request).run(client))
    assert handle.calls == [
        ("complete_choices", {"session_id": "ses_1"}, (request,)),
        ("complete_choices", {}, (request,)),
        ("stream", {"stream": True, "session_id": "ses_1"}, (request,)),
        ("stream", {"stream": True}, (request,)),
    ]


def test_a_bad_session_header_is_a_400_in_the_api_s_error_shape_and_a_good_one_is_served():
    from test_router_api import USER, client_for

    body = {"model": "glm", "messages": [{"role": "user", "content": "hi"}]}
    with client_for() as client:
        bad = client.post(
            "/v1/chat/completions", json=body, headers={**USER, SESSION_HEADER: "x" * 300}
        )
        good = client.post(
            "/v1/chat/completions", json=body, headers={**USER, SESSION_HEADER: "ses_1"}
        )
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", SESSION_HEADER)
    assert good.status_code == 200, good.text


def test_a_session_s_replicas_are_offered_in_its_order_and_serve_backs_off_when_all_are_full():
    """What the router hands Serve's routing loop for a request of a session: its own replica,
    then its next ones, one at a time; and backing off before the next round (Serve's loop
    asks again at once otherwise). Only `choose_replicas`, which reads nothing else."""
    router = object.__new__(SessionAffinityRouter)
    pool = replicas("a", "b", "c", "d", "e")
    request = SimpleNamespace(
        metadata=SimpleNamespace(session_id="ses_1"),
        routing_context=SimpleNamespace(should_backoff=False),
    )
    ranks = asyncio.run(router.choose_replicas(pool, request))  # type: ignore[arg-type]
    assert ranks == [[replica] for replica in session_rank("ses_1", pool)[: 1 + FALLBACK_REPLICAS]]
    assert request.routing_context.should_backoff
