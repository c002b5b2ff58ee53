"""Fake model handles (no Ray): they answer like the real replicas' deployment handles, so the
router's own app can run on them (wrapped in the typed clients of deployments.contracts, as real
handles are), each method taking the one request its replica's takes. One set for the router's
unit tests (tests/unit/router_fakes.py) and the router_cpu suite: a fake that falls behind a
server's interface fails both at once (tests/unit/test_deployment_contracts.py)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from deployments.config import PROJECT_ROOT, AppConfig, parse_app_config
from deployments.contracts.chat_deployment import ChatRequest
from deployments.contracts.embedding_deployment import EmbedRequest
from deployments.contracts.encoder_outputs import EmbeddingResult, ModerationResult
from deployments.contracts.moderation_deployment import ClassifyRequest
from deployments.contracts.outputs import Completion, GenerationChunk
from deployments.contracts.replies import Reply
from deployments.errors import ServingError
from deployments.replica.batched import check_dimensions

SERVE_CONFIG = PROJECT_ROOT / "serve_config.yaml"
DIMENSION = 4  # the fake embedding's default: small vectors that tests can read
BAD_WORD = "darn"  # what the fake moderation model flags


def reply(value: Any) -> Reply[Any]:
    return Reply(value, replica_ready_at=0.0, replica_load_s=0.0)


async def _awake() -> float:
    """A wake call's answer (ModelServer.wake): when the replica was ready."""
    return 0.0


class Method:
    """`handle.method.remote(request)`: records the request, returns an awaitable of the reply
    (`wake`'s takes none: its calls record None)."""

    def __init__(self, run: Callable[..., Any]):
        self.run = run
        self.calls: list[Any] = []

    def remote(self, *request: Any) -> Any:
        self.calls.append(request[0] if request else None)
        return self.run(*request)


class GroupedMethod(Method):
    """`handle.<method>_many.remote(list of requests)`, as the text replicas have it
    (deployments.replica.batched): each request through `single` (so its calls record them), a
    request's ServingError answered in its place, any other failure failing the whole call."""

    def __init__(self, single: Method):
        super().__init__(self._run_all)
        self.single = single

    async def _run_all(self, requests: list[Any]) -> list[Any]:
        answers: list[Any] = []
        for request in requests:
            try:
                answers.append(await self.single.remote(request))
            except ServingError as error:
                answers.append(error)
        return answers


class FakeStream:
    """A DeploymentResponseGenerator of Replies; raises `error` after `fail_after` chunks."""

    def __init__(self, chunks: list[GenerationChunk], fail_after: int | None, error: Exception):
        self._chunks = list(chunks)
        self._fail_after = fail_after
        self._error = error
        self._sent = 0
        self.cancelled = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> Reply[GenerationChunk]:
        if self._fail_after is not None and self._sent >= self._fail_after:
            raise self._error
        if self._sent >= len(self._chunks):
            raise StopAsyncIteration
        self._sent += 1
        return reply(self._chunks[self._sent - 1])

    def cancel(self) -> None:
        self.cancelled = True


class FakeChatHandle:
    """Answers `text` in pieces; `fail` (an exception) fails every call before its first byte,
    `stream_fails_after` fails a stream after that many chunks."""

    def __init__(
        self,
        text: str = "hello from the fake model",
        fail: Exception | None = None,
        stream_fails_after: int | None = None,
        stream_error: Exception | None = None,
    ):
        self.text = text
        self.fail = fail
        self.stream_fails_after = stream_fails_after
        self.stream_error = stream_error or RuntimeError("the replica crashed mid-stream")
        # The chat service asks for all n choices at once (ChatServer.complete_choices).
        self.complete = Method(self._complete)
        self.complete_choices = self.complete
        self.stream = Method(self._stream)
        self.streams: list[FakeStream] = []
        self.wake = Method(_awake)

    def options(self, **_: Any) -> FakeChatHandle:
        return self

    async def _complete(self, request: ChatRequest) -> Reply[list[Completion]]:
        if self.fail is not None:
            raise self.fail
        return reply(
            [
                Completion(self.text, "stop", prompt_tokens=7, completion_tokens=5, index=i)
                for i in range(request.features.n)
            ]
        )

    def _stream(self, request: ChatRequest) -> FakeStream:
        if self.fail is not None:
            stream = FakeStream([], 0, self.fail)
        else:
            words = self.text.split(" ")
            chunks = [
                GenerationChunk(
                    word + ("" if last else " "),
                    "stop" if last else None,
                    prompt_tokens=7,
                    completion_tokens=index + 1,
                )
                for index, word in enumerate(words)
                for last in [index == len(words) - 1]
            ]
            stream = FakeStream(chunks, self.stream_fails_after, self.stream_error)
        self.streams.append(stream)
        return stream


class FakeEmbeddingHandle:
    """`dimension`-wide float32 rows: by default the same readable ramp for every text; with
    `rng`, random unit-length rows, as the ONNX graph returns them (what a benchmark encodes)."""

    def __init__(
        self,
        fail: Exception | None = None,
        dimension: int = DIMENSION,
        rng: np.random.Generator | None = None,
    ):
        self.fail = fail
        self.dimension = dimension
        self._rng = rng
        self.embed = Method(self._embed)
        self.wake = Method(_awake)
        self.embed_many = GroupedMethod(self.embed)

    def _vectors(self, count: int) -> np.ndarray:
        if self._rng is None:
            return np.tile(np.arange(self.dimension, dtype=np.float32) / 10, (count, 1))
        vectors = self._rng.standard_normal((count, self.dimension), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors

    async def _embed(self, request: EmbedRequest) -> Reply[EmbeddingResult]:
        check_dimensions(request.dimensions, self.dimension, "embedding")  # as the replica does
        if self.fail is not None:
            raise self.fail
        texts = request.texts
        vectors = self._vectors(len(texts))
        return reply(EmbeddingResult(vectors, [len(text.split()) + 2 for text in texts]))


def fake_verdicts(texts: list[str]) -> list[ModerationResult]:
    results = []
    for text in texts:
        bad = BAD_WORD in text
        results.append(
            ModerationResult(
                flagged=bad,
                categories={"profanity": bad, "harassment": False},
                category_scores={"profanity": 0.9 if bad else 0.1, "harassment": 0.0},
            )
        )
    return results


class FakeModerationHandle:
    def __init__(self) -> None:
        self.classify = Method(self._classify)
        self.wake = Method(_awake)
        self.classify_many = GroupedMethod(self.classify)

    async def _classify(self, request: ClassifyRequest) -> Reply[list[ModerationResult]]:
        return reply(fake_verdicts(request.texts))


class FakeInRouterModeration:
    """The gate's classifier opened in the router (open_gate_classifier): flags BAD_WORD,
    remembers the directory it was opened from and every call."""

    def __init__(self) -> None:
        self.opened: list[Path] = []
        self.calls: list[list[str]] = []

    def open(self, model_dir: Path) -> FakeInRouterModeration:
        self.opened.append(model_dir)
        return self

    def classify(self, texts: list[str]) -> list[ModerationResult]:
        self.calls.append(list(texts))
        return fake_verdicts(texts)


def app_config(*, serve_config: Path = SERVE_CONFIG, **router: Any) -> AppConfig:
    """`serve_config`'s args, with no real network delay (the simulated RTT is a sleep, neither
    work nor CPU) and `router` settings changed."""
    (application,) = yaml.safe_load(serve_config.read_text(encoding="utf-8"))["applications"]
    args = copy.deepcopy(application["args"])
    args["edge"]["latency"]["real_delay_scale"] = 0
    args["router"].update(router)
    return parse_app_config(args)


def handle_for_task(task: str) -> Any:
    """A fresh fake handle, as built by default, for a model of `task`."""
    fakes: dict[str, Callable[[], Any]] = {
        "chat": FakeChatHandle,
        "embedding": FakeEmbeddingHandle,
        "moderation": FakeModerationHandle,
    }
    return fakes[task]()


def fake_handles(**overrides: Any) -> dict[str, Any]:
    handles: dict[str, Any] = {
        "glm": FakeChatHandle(),
        "kimi": FakeChatHandle(),
        "embedding": FakeEmbeddingHandle(),
        "moderation": FakeModerationHandle(),
    }
    handles.update(overrides)
    return handles


def in_every_region(config: AppConfig, handles: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Handles by model -> by model and region: every region shares its model's fake handle."""
    return {model: dict.fromkeys(config.edge.region_names, h) for model, h in handles.items()}
