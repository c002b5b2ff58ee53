"""The chat deployment's contract: its request, the remote methods the router calls
(deployments.replica.chat.ChatServer) and the typed client the router holds of its handle."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Self, cast

from deployments.contracts.chat_features import ChatFeatures
from deployments.contracts.model_deployment import ModelClient, ModelServerProtocol, ReplyStream
from deployments.contracts.outputs import Completion, GenerationChunk
from deployments.contracts.replies import Reply
from deployments.contracts.sampling_params import SamplingParams

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle


@dataclass(frozen=True)
class ChatRequest:
    """One generation, as `complete`, `complete_choices` and `stream` take it: the messages (or,
    with `features.raw`, the last one's content as the whole prompt), how to sample, the
    request's trace context and what it asks beyond sampling (n, tools, a response format)."""

    messages: Sequence[Mapping[str, Any]]
    params: SamplingParams
    traceparent: str | None = None
    features: ChatFeatures = ChatFeatures()


class ChatServerProtocol(ModelServerProtocol, Protocol):
    async def complete(self, request: ChatRequest) -> Reply[Completion]: ...

    async def complete_choices(self, request: ChatRequest) -> Reply[list[Completion]]: ...

    def stream(self, request: ChatRequest) -> AsyncIterator[Reply[GenerationChunk]]: ...


class ChatClient(ModelClient):
    """A chat deployment's handle, typed; its streaming form is made once, on the first stream
    (Ray Serve LLM's lesson: each handle option set costs the controller)."""

    def __init__(self, handle: DeploymentHandle[Any]) -> None:
        super().__init__(handle)
        self._streaming: DeploymentHandle[Any] | None = None
        self._unrouted: ChatClient | None = None  # the client a session's view was made from
        self._session = ""

    def in_session(self, session: str) -> Self:
        routed = super().in_session(session)
        routed._streaming, routed._unrouted, routed._session = None, self, session
        return routed

    def streaming_handle(self) -> DeploymentHandle[Any]:
        if self._streaming is None:
            if self._unrouted is not None:  # the kept streaming form, routed to the session
                self._streaming = self._unrouted.streaming_handle().options(
                    session_id=self._session
                )
            else:
                self._streaming = self.handle.options(stream=True)
        return self._streaming

    def complete_choices(self, request: ChatRequest) -> Awaitable[Reply[list[Completion]]]:
        return cast(
            "Awaitable[Reply[list[Completion]]]", self.handle.complete_choices.remote(request)
        )

    def stream(self, request: ChatRequest) -> ReplyStream[Reply[GenerationChunk]]:
        return cast(
            "ReplyStream[Reply[GenerationChunk]]", self.streaming_handle().stream.remote(request)
        )
