"""Each deployment's contract (deployments.contracts.*_deployment) against the code on both
sides of the Ray call: the replica class has every remote method its Protocol names, with the same
request type, return type and sync/async form, so a server signature changed alone fails here; the
typed client the router holds calls those methods with those types; the fake handles the router's
tests run on answer the same methods."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import pytest

from benchmarks.lib.fake_handles import (
    FakeChatHandle,
    FakeEmbeddingHandle,
    FakeModerationHandle,
)
from deployments.contracts.chat_deployment import ChatClient, ChatServerProtocol
from deployments.contracts.edge_control_deployment import (
    EdgeControlClient,
    EdgeControlProtocol,
)
from deployments.contracts.embedding_deployment import EmbeddingClient, EmbeddingServerProtocol
from deployments.contracts.front_spare_deployment import FrontSpareClient, FrontSpareProtocol
from deployments.contracts.model_deployment import ModelClient, ModelServerProtocol
from deployments.contracts.moderation_deployment import ModerationClient, ModerationServerProtocol
from deployments.contracts.warm_pool_deployment import WarmPoolClient, WarmPoolProtocol
from deployments.control.edge_control import EdgeControl
from deployments.control.front_spare import FrontSpare
from deployments.control.warm_pool import WarmPool
from deployments.replica.batched import EmbeddingServer, ModerationServer
from deployments.replica.chat import ChatServer

CONTRACTS = [
    (ChatServerProtocol, ChatServer, ChatClient, FakeChatHandle),
    (EmbeddingServerProtocol, EmbeddingServer, EmbeddingClient, FakeEmbeddingHandle),
    (ModerationServerProtocol, ModerationServer, ModerationClient, FakeModerationHandle),
]


def remote_methods(protocol: type) -> list[str]:
    return sorted(
        name
        for name in dir(protocol)
        if not name.startswith("_") and inspect.isfunction(getattr(protocol, name))
    )


def signature(method: Callable[..., Any]) -> tuple[Any, ...]:
    """What a caller relies on: parameter names and types, return type, awaited or iterated."""
    hints = typing.get_type_hints(method)
    params = [p for p in inspect.signature(method).parameters if p != "self"]
    return (
        [(name, hints.get(name)) for name in params],
        hints.get("return"),
        inspect.iscoroutinefunction(method),
    )


def mismatches(protocol: type, server: type) -> list[str]:
    found = []
    for name in remote_methods(protocol):
        method = getattr(server, name, None)
        if method is None:
            found.append(f"{server.__name__} has no {name}")
        elif signature(method) != signature(getattr(protocol, name)):
            found.append(f"{server.__name__}.{name}{signature(method)}")
    return found


@pytest.mark.parametrize(("protocol", "server", "client", "fake"), CONTRACTS)
def test_the_replica_class_serves_every_method_of_its_protocol_as_declared(
    protocol: type, server: type, client: type, fake: type
) -> None:
    assert remote_methods(protocol)
    assert mismatches(protocol, server) == []


def test_a_replica_whose_signature_changed_is_caught() -> None:
    class Changed(EmbeddingServer):
        async def embed(self, texts: list[str], traceparent: str | None = None) -> Any:  # type: ignore[override]
            return None

    assert mismatches(EmbeddingServerProtocol, Changed) == [
        f"Changed.embed{signature(Changed.embed)}"
    ]
    assert mismatches(ModelServerProtocol, type("Bare", (), {})) == [
        "Bare has no describe",
        "Bare has no hold",
        "Bare has no wake",
    ]


@pytest.mark.parametrize(("protocol", "server", "client", "fake"), CONTRACTS)
def test_the_typed_client_takes_each_method_s_request_type(
    protocol: type, server: type, client: type, fake: type
) -> None:
    """A client method named as a remote method takes that method's parameters (the request);
    the methods every model has come from ModelClient."""
    calls = [name for name in remote_methods(protocol) if hasattr(client, name)]
    assert set(remote_methods(ModelServerProtocol)) <= set(calls)
    assert len(calls) > len(remote_methods(ModelServerProtocol))  # its own methods too
    for name in calls:
        expected, _, _ = signature(getattr(protocol, name))
        taken, _, _ = signature(getattr(client, name))
        assert taken == expected, (client.__name__, name)
    assert issubclass(client, ModelClient)


@pytest.mark.parametrize(("protocol", "server", "client", "fake"), CONTRACTS)
def test_the_fake_handles_answer_every_method_the_client_calls(
    protocol: type, server: type, client: type, fake: type
) -> None:
    handle = fake()
    for name in remote_methods(protocol):
        if hasattr(client, name) and name not in ("hold", "describe"):
            assert hasattr(getattr(handle, name), "remote"), (fake.__name__, name)


def test_edge_control_serves_its_protocol_and_its_client_calls_every_method_as_declared() -> None:
    """The routers' drills, dashboard and region pools and the replicas' fault gate reach
    edge-control through EdgeControlClient only: it has every remote method, with its
    parameters."""
    assert mismatches(EdgeControlProtocol, EdgeControl) == []
    assert len(remote_methods(EdgeControlProtocol)) == 11
    for name in remote_methods(EdgeControlProtocol):
        expected, _, _ = signature(getattr(EdgeControlProtocol, name))
        assert signature(getattr(EdgeControlClient, name))[0] == expected, name


def test_the_warm_pool_serves_its_protocol_and_its_client_calls_every_method() -> None:
    assert mismatches(WarmPoolProtocol, WarmPool) == []
    for name in remote_methods(WarmPoolProtocol):
        assert signature(getattr(WarmPoolClient, name))[0] == []  # no arguments to pass


def test_the_front_spare_serves_its_protocol_and_its_client_calls_every_method() -> None:
    assert mismatches(FrontSpareProtocol, FrontSpare) == []
    for name in remote_methods(FrontSpareProtocol):
        assert signature(getattr(FrontSpareClient, name))[0] == []  # no arguments to pass
