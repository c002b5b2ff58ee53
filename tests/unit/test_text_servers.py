"""The embedding and moderation replicas' request handling, without Ray: a grouped call (what the
router's coalescing sends) runs as one forward pass, each request keeps its own result and error,
and the autoscaling metric counts requests, not calls. Ray Serve's own `@serve.batch` runs here;
only its look-up of the replica's context (a warning check) is given a stand-in. Its queue is
one per decorated method and process, bound to the event loop it first ran on (a replica has one
loop): every test here runs on the module's one loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from deployments.contracts.autoscaling import REQUESTS_METRIC
from deployments.contracts.embedding_deployment import EmbedRequest
from deployments.contracts.encoder_outputs import EmbeddingResult
from deployments.contracts.moderation_deployment import ClassifyRequest
from deployments.contracts.replies import Reply
from deployments.contracts.session_config import SessionConfig
from deployments.errors import InvalidRequestError
from deployments.replica.batched import EmbeddingServer, ModerationServer
from tests.unit.router_fakes import fake_verdicts
from tests.waiting import until


@pytest.fixture(autouse=True)
def replica_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """`@serve.batch` reads max_ongoing_requests from the replica's context to warn about it."""
    context = SimpleNamespace(_deployment_config=SimpleNamespace(max_ongoing_requests=64))
    monkeypatch.setattr("ray.serve.get_replica_context", lambda: context)


class FakeTextRuntime:
    """Records each forward pass; an empty text is invalid (as the real runtimes' `check`);
    `gate`, when set, holds every forward pass until it is set."""

    dimension = 2

    def __init__(self, model_dir: Path, session: SessionConfig) -> None:
        self.passes: list[list[str]] = []
        self.gate: threading.Event | None = None

    def describe(self) -> dict[str, Any]:
        return {}

    def check(self, texts: list[str]) -> None:
        if any(not text for text in texts):
            raise InvalidRequestError("input must not be empty", param="input")

    def tokenize(self, texts: list[str]) -> list[str]:
        """The embedding runtime's checked tokens: here the texts themselves."""
        self.check(texts)
        return list(texts)

    def embed_tokens(self, texts: list[str]) -> EmbeddingResult:
        self._forward(texts)
        vectors = np.array([[len(text), i] for i, text in enumerate(texts)], dtype=np.float32)
        return EmbeddingResult(vectors, [len(text) for text in texts])

    def classify(self, texts: list[str]) -> list[Any]:
        self._forward(texts)
        return fake_verdicts(texts)

    def _forward(self, texts: list[str]) -> None:
        self.passes.append(list(texts))
        if self.gate is not None:
            self.gate.wait(timeout=30)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as runner:
        yield runner


def server(cls: type) -> Any:
    replica = cls(
        "/models/x",
        SessionConfig(provider="cpu"),
        runtime_factory=FakeTextRuntime,
        observability={"metrics": False},
    )
    replica.reconfigure({"max_batch_size": 32, "batch_wait_timeout_s": 0.01})
    return replica


def test_a_grouped_embedding_call_is_one_forward_pass_with_each_requests_own_rows(
    loop: asyncio.Runner,
) -> None:
    replica = server(EmbeddingServer)
    answers = loop.run(
        replica.embed_many(
            [EmbedRequest(["a", "bb"]), EmbedRequest([""]), EmbedRequest(["ccc"], dimensions=2)]
        )
    )
    assert replica.runtime.passes == [["a", "bb", "ccc"]]  # the bad request never ran
    first, bad, last = answers
    assert isinstance(first, Reply) and isinstance(last, Reply)
    assert first.value.vectors.tolist() == [[1.0, 0.0], [2.0, 1.0]]
    assert first.value.token_counts == [1, 2]
    assert last.value.vectors.tolist() == [[3.0, 2.0]]  # its row of the merged pass
    assert isinstance(bad, InvalidRequestError) and bad.param == "input"


def test_a_request_asking_for_other_dimensions_fails_alone(loop: asyncio.Runner) -> None:
    replica = server(EmbeddingServer)
    ok, wrong = loop.run(
        replica.embed_many([EmbedRequest(["a"]), EmbedRequest(["b"], dimensions=384)])
    )
    assert isinstance(ok, Reply)
    assert isinstance(wrong, InvalidRequestError) and wrong.param == "dimensions"
    assert replica.runtime.passes == [["a"]]


def test_a_grouped_moderation_call_answers_each_request_in_order(loop: asyncio.Runner) -> None:
    replica = server(ModerationServer)
    answers = loop.run(
        replica.classify_many([ClassifyRequest(["fine"]), ClassifyRequest(["darn", "ok"])])
    )
    assert [[v.flagged for v in answer.value] for answer in answers] == [[False], [True, False]]
    assert replica.runtime.passes == [["fine", "darn", "ok"]]


def test_the_autoscaling_metric_counts_every_request_of_a_grouped_call(
    loop: asyncio.Runner,
) -> None:
    replica = server(EmbeddingServer)
    replica.runtime.gate = threading.Event()

    async def scenario() -> tuple[float, float, float]:
        requests = [EmbedRequest([text]) for text in ("a", "b", "c")]
        grouped = asyncio.ensure_future(replica.embed_many(requests))
        single = asyncio.ensure_future(replica.embed(EmbedRequest(["d"])))
        # The forward pass (its own thread) has started and holds them all.
        await until(lambda: replica.runtime.passes, 30, "the forward pass")
        held = replica.record_autoscaling_stats()[REQUESTS_METRIC]
        replica.runtime.gate.set()
        await asyncio.gather(grouped, single)
        return held, replica.record_autoscaling_stats()[REQUESTS_METRIC], len(grouped.result())

    held, after, answered = loop.run(scenario())
    assert (held, after, answered) == (4.0, 0.0, 3)


class CountingTokenizer:
    """The embedding runtime's tokenizer, counting the texts it encodes."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.encoded: list[str] = []

    def encode(self, texts: list[str]) -> Any:
        self.encoded.extend(texts)
        return self._tokenizer.encode(texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def test_an_embedding_request_is_tokenized_once(loop: asyncio.Runner, models_root: Path) -> None:
    """Its validation (a text past the context is refused before any batch) and the forward
    pass share one encoding; the usage it reports is those tokens."""
    replica = EmbeddingServer(
        str(models_root / "embedding"), SessionConfig(provider="cpu"), observability={}
    )
    replica.reconfigure({"max_batch_size": 32, "batch_wait_timeout_s": 0.01})
    tokenizer = replica.runtime.tokenizer = CountingTokenizer(replica.runtime.tokenizer)
    first, second = ["one text", "and another"], ["a third"]
    answers = loop.run(replica.embed_many([EmbedRequest(first), EmbedRequest(second)]))
    single = loop.run(replica.embed(EmbedRequest(["alone"])))
    assert tokenizer.encoded == [*first, *second, "alone"]  # each text once
    assert all(isinstance(answer, Reply) for answer in answers)
    assert single.value.vectors.shape == (1, replica.runtime.dimension)
    assert single.value.token_counts == replica.runtime.check(["alone"])
