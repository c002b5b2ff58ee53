"""The moderation gate when its classifier fails, per direction (input, output) and mode
(fail_closed, fail_open): the gate itself with a classifier that raises, then the router's
services and API with the classifier failing where it runs (in the router, or as the moderation
deployment): a 503 in each API's shape with Retry-After, or the text passed unchecked and marked
(x-moderation-skipped, never cached), each failure counted."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from router_fakes import (
    BAD_WORD,
    FakeChatHandle,
    FakeInRouterModeration,
    FakeModerationHandle,
    app_config,
    fake_handles,
    services_for,
)

from deployments.config import AppConfig
from deployments.config.security import GateFailureModes, ModerationGateConfig
from deployments.contracts.encoder_outputs import ModerationResult
from deployments.contracts.outputs import GenerationChunk
from deployments.errors import ModerationUnavailableError
from deployments.ingress.api.app import make_app
from deployments.ingress.protocol import ChatCompletionRequest
from deployments.ingress.security import ModerationGate, Principal, RateLimits
from deployments.ingress.security.gate_failures import SKIPPED_HEADER
from deployments.ingress.serving.context import RequestContext
from deployments.observability import (
    InMemoryMetricsBackend,
    RouterObservability,
    configure_access_logger,
)

MARKER = "BAD"


class BrokenClassifier(Exception):
    """What a classifier raises here: not a ServingError, as an ONNX or Ray failure is not."""


class Classifier:
    """Flags MARKER; from call number `fails_from` on (1-based) it raises instead."""

    def __init__(self, fails_from: int = 1) -> None:
        self.fails_from = fails_from
        self.calls: list[list[str]] = []

    async def __call__(self, texts: list[str]) -> list[bool]:
        self.calls.append(list(texts))
        if len(self.calls) >= self.fails_from:
            raise BrokenClassifier("the classifier's session is gone")
        return [MARKER in text for text in texts]


class Recorded:
    """The gate's two reports: failures counted (the metric) and skips noted (the request)."""

    def __init__(self) -> None:
        self.failures: list[tuple[str, str]] = []
        self.skipped: list[str] = []

    def failure(self, direction: str, mode: str) -> None:
        self.failures.append((direction, mode))


def gate_with(
    classify: Classifier, *, input: str = "fail_closed", output: str = "fail_closed"
) -> tuple[ModerationGate, Recorded]:
    modes = GateFailureModes(input=input, output=output)  # type: ignore[arg-type]
    config = ModerationGateConfig(
        models=["glm"], window_chars=10, overlap_chars=4, on_classifier_failure=modes
    )
    recorded = Recorded()
    return ModerationGate(config, classify, on_failure=recorded.failure), recorded


async def pieces(*texts: str) -> AsyncIterator[GenerationChunk]:
    for number, text in enumerate(texts, 1):
        yield GenerationChunk(text, "stop" if number == len(texts) else None, 3, number)


def streamed(gate: ModerationGate, recorded: Recorded, *texts: str) -> list[GenerationChunk]:
    async def collect() -> list[GenerationChunk]:
        guarded = gate.guard_stream(pieces(*texts), on_skip=recorded.skipped.append)
        return [chunk async for chunk in guarded]

    return asyncio.run(collect())


# ---- the config ---------------------------------------------------------------------------------


def test_both_directions_fail_closed_by_default_and_a_mistyped_mode_is_named():
    modes = ModerationGateConfig().on_classifier_failure
    assert (modes.input, modes.output, modes.retry_after_s) == ("fail_closed", "fail_closed", 5)
    with pytest.raises(ValidationError, match=r"on_classifier_failure\.output") as caught:
        ModerationGateConfig.model_validate({"on_classifier_failure": {"output": "open"}})
    assert "fail_open" in str(caught.value)
    with pytest.raises(ValidationError, match="retry_after_s"):
        GateFailureModes(retry_after_s=0)


# ---- the gate, with a classifier that raises ----------------------------------------------------


def test_a_failed_input_check_that_fails_closed_is_a_503_to_retry():
    gate, recorded = gate_with(Classifier(), output="fail_open")
    with pytest.raises(ModerationUnavailableError) as caught:
        asyncio.run(gate.check_input([{"role": "user", "content": "hi"}], recorded.skipped.append))
    error = caught.value
    assert (error.status, error.code) == (503, "moderation_unavailable")
    assert error.response_headers() == {"retry-after": "5", "retry-after-ms": "5000"}
    assert isinstance(error.__cause__, BrokenClassifier)
    assert recorded.failures == [("input", "fail_closed")] and recorded.skipped == []


def test_a_failed_input_check_that_fails_open_passes_and_is_noted():
    gate, recorded = gate_with(Classifier(), input="fail_open")
    messages = [{"role": "user", "content": f"{MARKER} words"}]
    asyncio.run(gate.check_input(messages, recorded.skipped.append))
    assert recorded.failures == [("input", "fail_open")] and recorded.skipped == ["input"]


@pytest.mark.parametrize("mode", ["fail_closed", "fail_open"])
def test_a_failed_check_of_a_whole_answer_refuses_or_passes_it_unchanged(mode):
    gate, recorded = gate_with(Classifier(), input="fail_open", output=mode)
    text = f"a {MARKER} answer"
    if mode == "fail_closed":
        with pytest.raises(ModerationUnavailableError):
            asyncio.run(gate.filter_output(text, "stop", recorded.skipped.append))
        assert recorded.skipped == []
    else:
        answer = asyncio.run(gate.filter_output(text, "stop", recorded.skipped.append))
        assert answer == (text, "stop") and recorded.skipped == ["output"]
    assert recorded.failures == [("output", mode)]


def test_a_stream_whose_check_fails_closed_ends_with_the_error_after_what_was_checked():
    classify = Classifier(fails_from=2)
    gate, recorded = gate_with(classify, input="fail_open")

    async def collect(released: list[GenerationChunk]) -> None:
        async for chunk in gate.guard_stream(pieces("fine ", "then ", "more"), 1):
            released.append(chunk)

    released: list[GenerationChunk] = []
    with pytest.raises(ModerationUnavailableError):
        asyncio.run(collect(released))
    assert [chunk.text for chunk in released] == ["fine "]  # checked before the failure
    assert recorded.failures == [("output", "fail_closed")]


def test_a_stream_whose_check_fails_open_flows_unchecked_from_there_and_asks_no_more():
    classify = Classifier(fails_from=2)
    gate, recorded = gate_with(classify, output="fail_open")
    chunks = streamed(gate, recorded, "fine ", "then", f" {MARKER} ", "end")
    assert "".join(chunk.text for chunk in chunks) == f"fine then {MARKER} end"
    assert chunks[-1].finish_reason == "stop"
    assert len(classify.calls) == 2  # one failure, no stalled call per piece after it
    assert recorded.failures == [("output", "fail_open")] and recorded.skipped == ["output"]


def test_a_classifier_answering_the_wrong_count_is_a_failure_not_a_pass():
    async def broken(texts: list[str]) -> list[bool]:
        return []

    gate = ModerationGate(ModerationGateConfig(models=["glm"]), broken)
    with pytest.raises(ModerationUnavailableError) as caught:
        asyncio.run(gate.filter_output("text", "stop"))
    assert "verdicts" in str(caught.value.__cause__)


# ---- the router: the classifier failing where it runs -------------------------------------------

WHO = Principal("alice", RateLimits())


class FailingInRouter(FakeInRouterModeration):
    """The router's own classifier, raising from call number `fails_from` on."""

    def __init__(self, fails_from: int) -> None:
        super().__init__()
        self.fails_from = fails_from

    def classify(self, texts: list[str]) -> list[ModerationResult]:
        verdicts = super().classify(texts)
        if len(self.calls) >= self.fails_from:
            raise BrokenClassifier("the router's classifier session is gone")
        return verdicts


class FailingDeployment(FakeModerationHandle):
    """The moderation deployment, failing from call number `fails_from` on."""

    def __init__(self, fails_from: int) -> None:
        super().__init__()
        answer = self.classify.run

        async def classify(*request: Any) -> Any:
            if len(self.classify.calls) >= fails_from:
                raise BrokenClassifier("the moderation replica died")
            return await answer(*request)

        self.classify.run = classify


def router_config(where: str, input: str, output: str) -> AppConfig:
    config = app_config()
    modes = GateFailureModes(input=input, output=output)  # type: ignore[arg-type]
    gate = config.security.moderation_gate.model_copy(
        update={"classifier": where, "on_classifier_failure": modes}
    )
    security = config.security.model_copy(update={"moderation_gate": gate})
    return config.model_copy(update={"security": security})


class Router:
    """The router's services on fake handles, glm gated, its classifier failing where it runs
    (`where`: "router" or "deployment") from call `fails_from` on; failures counted."""

    def __init__(
        self,
        where: str,
        fails_from: int,
        *,
        input: str = "fail_closed",
        output: str = "fail_closed",
        text: str = "hello from the fake model",
    ) -> None:
        classifier = "deployment" if where == "deployment" else "in_router_if_embedded"
        self.config = router_config(classifier, input, output)
        self.metrics = InMemoryMetricsBackend()
        observability = RouterObservability(
            self.config.observability,
            self.config.models,
            metrics_backend=self.metrics,
            access_logger=configure_access_logger(stream=io.StringIO()),
        )
        self.glm = FakeChatHandle(text=text)
        self.handles = fake_handles(glm=self.glm)
        in_router = FakeInRouterModeration()
        if where == "deployment":
            self.handles["moderation"] = FailingDeployment(fails_from)
        else:
            in_router = FailingInRouter(fails_from)
        self.services = services_for(
            self.config, self.handles, in_router=in_router, observability=observability
        )

    def complete(self, **fields: Any) -> Any:
        request = ChatCompletionRequest(
            model="glm", messages=[{"role": "user", "content": "hi there"}], **fields
        )
        return asyncio.run(self.services.chat.complete(request, RequestContext(principal=WHO)))

    def failures(self, direction: str, mode: str) -> float:
        name = "edge_moderation_gate_failures_total"
        return self.metrics.total(name, direction=direction, mode=mode)


WHERE = ["router", "deployment"]


@pytest.mark.parametrize("where", WHERE)
def test_an_input_check_that_fails_closed_refuses_the_chat(where):
    router = Router(where, fails_from=1)
    with pytest.raises(ModerationUnavailableError):
        router.complete()
    assert router.failures("input", "fail_closed") == 1


@pytest.mark.parametrize("where", WHERE)
def test_an_input_check_that_fails_open_answers_marked_and_uncached(where):
    router = Router(where, fails_from=1, input="fail_open", output="fail_open")
    answers = [router.complete(temperature=0) for _ in range(2)]
    assert [a.headers[SKIPPED_HEADER] for a in answers] == ["input,output"] * 2
    assert [a.headers["x-edge-cache"] for a in answers] == ["MISS", "MISS"]  # never stored
    assert len(router.glm.complete.calls) == 2
    assert router.failures("input", "fail_open") == 2


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("mode", ["fail_closed", "fail_open"])
def test_an_output_check_that_fails_refuses_or_passes_the_answer(where, mode):
    router = Router(where, fails_from=2, output=mode, text=f"well {BAD_WORD}")
    if mode == "fail_closed":
        with pytest.raises(ModerationUnavailableError):
            router.complete()
    else:
        answer = router.complete()
        assert answer.value.choices[0].message.content == f"well {BAD_WORD}"
        assert answer.headers[SKIPPED_HEADER] == "output"
    assert router.failures("output", mode) == 1 and router.failures("input", mode) == 0


@pytest.mark.parametrize("where", WHERE)
def test_a_checked_answer_carries_no_mark(where):
    answer = Router(where, fails_from=99).complete()
    assert SKIPPED_HEADER not in answer.headers


# ---- each API's own error shape -----------------------------------------------------------------

USER_KEY = "sk-user-0123456789abcdef"
USER = {"authorization": f"Bearer {USER_KEY}"}
CHAT = {"model": "glm", "messages": [{"role": "user", "content": "hi"}]}


def api_failing_from(fails_from: int) -> TestClient:
    """The router's app, its own classifier failing from call `fails_from` on; every side
    fails closed."""
    config = router_config("in_router_if_embedded", "fail_closed", "fail_closed")
    keys = {"EDGE_API_KEYS": f"alice:{USER_KEY}"}
    services = services_for(config, fake_handles(), keys, FailingInRouter(fails_from))
    return TestClient(make_app(config, services), raise_server_exceptions=False)


def test_a_closed_gate_answers_503_in_openai_s_shape_and_in_the_workers_ai_envelope():
    with api_failing_from(1) as api:
        openai = api.post("/v1/chat/completions", json=CHAT, headers=USER)
        workers = api.post("/ai/run/glm", json={"prompt": "hi"}, headers=USER)
    assert openai.status_code == workers.status_code == 503
    assert openai.headers["retry-after"] == workers.headers["retry-after"] == "5"
    error = openai.json()["error"]
    assert (error["type"], error["code"]) == ("overloaded_error", "moderation_unavailable")
    (envelope,) = workers.json()["errors"]
    assert envelope["code"] == 9507 and workers.json()["success"] is False


def test_a_stream_whose_output_check_fails_closed_ends_with_an_error_event():
    with api_failing_from(2) as api:
        response = api.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=USER)
    assert response.status_code == 200
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["code"] == "moderation_unavailable"
