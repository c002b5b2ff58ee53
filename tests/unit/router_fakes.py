"""The router built on fake model handles (no Ray): what the router's unit tests drive. The fakes
themselves live in benchmarks.lib.fake_handles, shared with the router_cpu suite."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, TypeVar

from benchmarks.lib.fake_handles import (
    BAD_WORD,
    DIMENSION,
    FakeChatHandle,
    FakeEmbeddingHandle,
    FakeInRouterModeration,
    FakeModerationHandle,
    FakeStream,
    Method,
    app_config,
    fake_handles,
    fake_verdicts,
    in_every_region,
    reply,
)
from deployments.config import AppConfig
from deployments.contracts.chat_deployment import ChatRequest
from deployments.contracts.outputs import Completion, GenerationChunk
from deployments.ingress.cache import SharedStore
from deployments.ingress.security import KeyStore
from deployments.ingress.serving.services import RouterServices, build_services
from deployments.observability import RouterObservability

__all__ = [
    "BAD_WORD",
    "DIMENSION",
    "FakeChatHandle",
    "FakeEmbeddingHandle",
    "FakeInRouterModeration",
    "FakeModerationHandle",
    "FakeStream",
    "Method",
    "ScriptedChatHandle",
    "app_config",
    "fake_handles",
    "fake_verdicts",
    "in_every_region",
    "reply",
    "services_for",
    "starting",
]
HandleT = TypeVar("HandleT")


def starting(handle: HandleT) -> HandleT:
    """`handle` with a wake that never answers: its pool's first replica is still starting, as
    the cold snapshot says (a fake's wake otherwise answers at once: a replica up all along)."""
    handle.wake = Method(_never_up)  # type: ignore[attr-defined]
    return handle


async def _never_up() -> float:
    await asyncio.Event().wait()
    raise AssertionError("an Event nobody sets was set")


class ScriptedChatHandle(FakeChatHandle):
    """Answers with the given completions (all n of them) and streams the given chunks, so a
    test can shape any answer: n choices, logprobs, tool calls."""

    def __init__(self, completions: list[Completion], chunks: list[GenerationChunk]):
        super().__init__()
        self.completions = completions
        self.chunks = chunks

    async def _complete(self, request: ChatRequest) -> Any:
        return reply(list(self.completions))

    def _stream(self, request: ChatRequest) -> Any:
        stream = FakeStream(self.chunks, None, RuntimeError("unused"))
        self.streams.append(stream)
        return stream


def services_for(
    config: AppConfig,
    handles: Mapping[str, Any],
    environ: Mapping[str, str] | None = None,
    in_router: FakeInRouterModeration | None = None,
    control: Any | None = None,
    *,
    cache_store: SharedStore | None = None,
    observability: RouterObservability | None = None,
) -> RouterServices:
    """`handles` by model (see in_every_region); `in_router`: the gate's classifier when the
    router runs its own (a fresh fake by default); `control`: an edge-control handle;
    `cache_store`: the response cache's shared tier (None: in this process only)."""
    keys = KeyStore.from_env(environ or {}, config.security)
    # A clock that stands still: token buckets refill with time, and a loaded machine is slow.
    return build_services(
        config,
        in_every_region(config, handles),
        keys=keys,
        clock=lambda: 0.0,
        open_gate_classifier=(in_router or FakeInRouterModeration()).open,
        cache_store=cache_store,
        observability=observability,
        control=control,
    )
