"""The router's FastAPI app from `make_app`, on fake model handles (no Ray): each route's answer
and error shape - OpenAI's on /v1, the Workers-AI envelope on /ai for every error, admin."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from router_fakes import (
    DIMENSION,
    FakeChatHandle,
    FakeEmbeddingHandle,
    FakeModerationHandle,
    app_config,
    fake_handles,
    services_for,
    starting,
)

from deployments.ingress.api.app import make_app

LIMIT = 2048
USER_KEY = "sk-user-0123456789abcdef"
ADMIN_KEY = "sk-admin-0123456789abcdef"
USER = {"authorization": f"Bearer {USER_KEY}"}
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
ENV = {"EDGE_API_KEYS": f"alice:{USER_KEY}", "EDGE_ADMIN_KEY": ADMIN_KEY}
HELLO = {"model": "kimi", "messages": [{"role": "user", "content": "hi"}]}
COLD_START_MS = 3000.0  # assumed until one is measured: the Retry-After arithmetic below uses it


def client_for(handles: dict[str, Any] | None = None, env: dict[str, str] = ENV) -> TestClient:
    config = app_config(max_body_bytes=LIMIT, default_cold_start_ms=COLD_START_MS)
    services = services_for(config, handles or fake_handles(), env)
    return TestClient(make_app(config, services), raise_server_exceptions=False)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with client_for() as test_client:
        yield test_client


def openai_error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert list(body) == ["error"] and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def envelope_error(response: Any, status: int) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["success"] is False and body["result"] is None and body["messages"] == []
    (error,) = body["errors"]
    assert error["code"] >= 1000 and error["message"]  # Cloudflare's codes, not HTTP statuses
    return str(error["message"])


def sse_data(response: Any) -> list[str]:
    return [
        line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")
    ]


# ---- OpenAI API ---------------------------------------------------------------------------------


def test_models_chat_embeddings_and_moderations_answer(client: TestClient):
    models = client.get("/v1/models", headers=USER).json()
    assert {m["id"] for m in models["data"]} == {"glm", "kimi", "embedding", "moderation"}
    chat = client.post("/v1/chat/completions", json=HELLO, headers=USER)
    assert chat.status_code == 200
    assert chat.json()["choices"][0]["message"]["content"] == "hello from the fake model"
    assert chat.headers["x-edge-colo"] and chat.headers["x-ratelimit-limit-requests"]
    embedded = client.post(
        "/v1/embeddings", json={"model": "embedding", "input": "a"}, headers=USER
    )
    assert len(embedded.json()["data"][0]["embedding"]) == DIMENSION
    moderated = client.post("/v1/moderations", json={"input": "fine"}, headers=USER)
    assert moderated.json()["results"][0]["flagged"] is False


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", HELLO),
        ("POST", "/v1/embeddings", {"model": "embedding", "input": "a"}),
        ("POST", "/v1/moderations", {"input": "a"}),
    ],
)
def test_every_openai_route_needs_a_key(client: TestClient, method: str, path: str, body: Any):
    error = openai_error(client.request(method, path, json=body), 401)
    assert error["type"] == "authentication_error"


def test_openai_errors_keep_their_shape(client: TestClient):
    bad_json = client.post(
        "/v1/chat/completions",
        content=b"{not json",
        headers={**USER, "content-type": "application/json"},
    )
    assert "JSON" in openai_error(bad_json, 400)["message"]
    invalid = client.post("/v1/chat/completions", json={"model": "glm"}, headers=USER)
    assert openai_error(invalid, 400)["param"] == "messages"
    unknown = client.post("/v1/chat/completions", json={**HELLO, "model": "gpt"}, headers=USER)
    assert openai_error(unknown, 404)["code"] == "model_not_found"
    wrong = client.post("/v1/embeddings", json={"model": "glm", "input": "x"}, headers=USER)
    assert openai_error(wrong, 400)["code"] == "model_task_mismatch"
    assert openai_error(client.get("/v2/nothing"), 404)["code"] == "route_not_found"
    not_allowed = client.get("/v1/embeddings")
    assert openai_error(not_allowed, 405)["code"] == "method_not_allowed"
    assert not_allowed.headers["allow"] == "POST"
    huge = client.post("/v1/embeddings", json={"model": "embedding", "input": "a" * LIMIT})
    assert openai_error(huge, 413)["code"] == "payload_too_large"
    dims = {"model": "embedding", "input": "a", "dimensions": 3}
    assert openai_error(client.post("/v1/embeddings", json=dims, headers=USER), 400)["param"] == (
        "dimensions"
    )


def test_a_rate_limited_key_gets_429_with_retry_after():
    config = app_config(max_body_bytes=LIMIT)
    limits = {"requests_per_minute": 1}
    security = config.security.model_copy(
        update={"per_key": {"alice": config.security.default_limits.model_copy(update=limits)}}
    )
    config = config.model_copy(update={"security": security})
    with TestClient(make_app(config, services_for(config, fake_handles(), ENV))) as client:
        assert client.post("/v1/moderations", json={"input": "a"}, headers=USER).status_code == 200
        limited = client.post("/v1/moderations", json={"input": "a"}, headers=USER)
        assert openai_error(limited, 429)["type"] == "rate_limit_error"
        assert int(limited.headers["retry-after"]) >= 1
        assert limited.headers["x-ratelimit-remaining-requests"] == "0"


def test_an_openai_stream_has_role_text_usage_and_done(client: TestClient):
    body = {**HELLO, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/chat/completions", json=body, headers=USER) as response:
        response.read()
    assert response.status_code == 200 and response.headers["x-edge-colo"]
    events = sse_data(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "hello from the fake model"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_a_stream_failing_midway_ends_with_an_openai_error_event_then_done():
    with client_for(fake_handles(kimi=FakeChatHandle(stream_fails_after=2))) as client:
        body = {**HELLO, "stream": True}
        response = client.post("/v1/chat/completions", json=body, headers=USER)
    assert response.status_code == 200  # the status was sent with the first chunk
    events = sse_data(response)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["type"] == "server_error" and "crashed" not in error["message"]


# ---- Workers AI API -----------------------------------------------------------------------------


def test_workers_ai_runs_each_task_in_an_envelope(client: TestClient):
    chat = client.post("/ai/run/glm", json={"prompt": "hi", "max_tokens": 4}, headers=USER)
    body = chat.json()
    assert body["success"] is True and body["errors"] == [] and body["messages"] == []
    assert body["result"]["response"] == "hello from the fake model"
    assert body["result"]["usage"]["total_tokens"] == 12 and chat.headers["x-edge-colo"]
    vectors = client.post("/ai/run/embedding", json={"text": ["a", "b"]}, headers=USER).json()
    assert vectors["result"]["shape"] == [2, DIMENSION]
    verdicts = client.post("/ai/run/moderation", json={"text": "darn"}, headers=USER).json()
    assert verdicts["result"][0]["flagged"] is True


def test_every_workers_ai_error_is_an_envelope(client: TestClient):
    bad_json = client.post(
        "/ai/run/glm", content=b"{not json", headers={**USER, "content-type": "application/json"}
    )
    assert "JSON" in envelope_error(bad_json, 400)
    envelope_error(client.post("/ai/run/glm", json={"max_tokens": 4}, headers=USER), 400)
    envelope_error(client.post("/ai/run/glm", json=["not", "an", "object"], headers=USER), 400)
    envelope_error(client.post("/ai/run/gpt", json={"prompt": "hi"}, headers=USER), 404)
    envelope_error(client.get("/ai/nothing/here"), 404)
    envelope_error(client.get("/ai/run/glm"), 405)
    envelope_error(client.post("/ai/run/glm", json={"prompt": "a" * LIMIT}, headers=USER), 413)
    envelope_error(client.post("/ai/run/glm", json={"prompt": "hi"}), 401)
    # ... and a request the model refuses.
    long_input = {"text": ["x"] * 300}  # over request_limits.max_batch_items
    assert "256" in envelope_error(
        client.post("/ai/run/embedding", json=long_input, headers=USER), 400
    )


def test_a_workers_stream_ends_with_an_envelope_error_event_then_done():
    with client_for(fake_handles(glm=FakeChatHandle(stream_fails_after=1))) as client:
        response = client.post("/ai/run/glm", json={"prompt": "hi", "stream": True}, headers=USER)
    assert response.status_code == 200
    events = sse_data(response)
    assert json.loads(events[-2])["success"] is False and events[-1] == "[DONE]"
    assert json.loads(events[-2])["errors"][0]["code"] == 9001  # an internal error


def test_a_workers_stream_sends_text_events_then_done():
    with client_for() as client:
        response = client.post("/ai/run/glm", json={"prompt": "hi", "stream": True}, headers=USER)
    events = sse_data(response)
    assert events[-1] == "[DONE]"
    pieces = [json.loads(event) for event in events[:-1]]
    assert "".join(piece["response"] for piece in pieces) == "hello from the fake model"


# ---- admin and probes ---------------------------------------------------------------------------


def test_admin_sets_and_clears_a_fault(client: TestClient):
    colos = client.get("/admin/colos", headers=ADMIN).json()
    assert "LHR" in {colo["id"] for colo in colos}
    down = client.post("/admin/colos/lhr/faults", json={"down": True}, headers=ADMIN)
    assert down.status_code == 200 and down.json()["id"] == "LHR"
    assert down.json()["healthy"] is False and down.json()["faults"]
    london = {**USER, "x-client-geo": "51.5,-0.12"}
    chat = client.post("/v1/chat/completions", json=HELLO, headers=london)
    assert chat.status_code == 200 and chat.headers["x-edge-colo"] != "LHR"
    cleared = client.delete("/admin/colos/LHR/faults", headers=ADMIN)
    assert cleared.status_code == 200
    assert cleared.json()["healthy"] is True and cleared.json()["faults"] == []


def test_admin_errors(client: TestClient):
    assert openai_error(client.get("/admin/colos", headers=USER), 403)["code"] == (
        "permission_denied"
    )
    assert openai_error(client.get("/admin/colos"), 401)["type"] == "authentication_error"
    unknown = client.delete("/admin/colos/XXX/faults", headers=ADMIN)
    assert openai_error(unknown, 404)["code"] == "colo_not_found"
    bad = client.post("/admin/colos/LHR/faults", json={"down": "sometimes"}, headers=ADMIN)
    openai_error(bad, 400)
    with client_for(env={"EDGE_API_KEYS": USER_KEY}) as no_admin:
        assert openai_error(no_admin.get("/admin/colos", headers=ADMIN), 404)["code"] == (
            "route_not_found"
        )


def test_probes_and_the_openapi_document(client: TestClient):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 500  # no Serve status without Ray: an error body
    paths = set(client.get("/openapi.json").json()["paths"])
    assert {
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/moderations",
        "/ai/run/{model_name}",
    } <= (paths)
    assert not any(path.startswith("/admin") for path in paths)


# ---- waiting for capacity: rejectIfBusy, x-edge-max-wait-ms, held streams -----------------------
# Without edge-control (as here) the router knows of no running replica: every region is cold,
# and a request would wait on a cold start.


def test_reject_if_busy_is_a_429_with_cloudflares_code_instead_of_a_wait():
    cold = fake_handles(
        glm=starting(FakeChatHandle()),
        kimi=starting(FakeChatHandle()),
        embedding=starting(FakeEmbeddingHandle()),
    )
    with client_for(cold) as client:
        reject_if_busy_is_a_429(client)


def reject_if_busy_is_a_429(client: TestClient) -> None:
    busy = {"options": {"rejectIfBusy": True}}
    workers = client.post("/ai/run/glm", json={"prompt": "hi", **busy}, headers=USER)
    # the cold start to plan on: 3 s (the configured mean, nothing measured yet) and a quarter,
    # less what the wake sent for it already waited (its probe, at most 0.2 s)
    assert workers.status_code == 429 and workers.headers["retry-after"] == "4"
    assert 3000 < int(workers.headers["retry-after-ms"]) <= 3750
    assert workers.json()["errors"] == [
        {"code": 3040, "message": "Capacity temporarily exceeded, please try again."}
    ]
    embedded = client.post("/ai/run/embedding", json={"text": "a", **busy}, headers=USER)
    assert embedded.json()["errors"][0]["code"] == 3040
    openai = client.post("/v1/chat/completions", json={**HELLO, **busy}, headers=USER)
    assert openai_error(openai, 429)["code"] == "capacity_exceeded"
    # Without the option the same request waits for the cold start and is served.
    assert client.post("/ai/run/glm", json={"prompt": "hi"}, headers=USER).status_code == 200
    # An option Workers AI does not define is refused like any unknown field.
    queued = client.post("/ai/run/glm", json={"prompt": "hi", "options": {"x": 1}}, headers=USER)
    assert "options.x" in envelope_error(queued, 400)


def test_a_wait_budget_shorter_than_the_cold_start_is_a_503_with_the_expected_wake_up(
    client: TestClient,
):
    short = {**USER, "x-edge-max-wait-ms": "500"}  # the cold-start estimate: 3000 ms
    response = client.post("/v1/chat/completions", json=HELLO, headers=short)
    assert openai_error(response, 503)["code"] == "wait_budget_exceeded"
    # 3 s and a quarter: a retry must find the replica up, not only on average
    assert (response.headers["retry-after"], response.headers["retry-after-ms"]) == ("4", "3750")
    long_enough = {**USER, "x-edge-max-wait-ms": "10000"}
    assert client.post("/v1/chat/completions", json=HELLO, headers=long_enough).status_code == 200
    bad = client.post(
        "/v1/chat/completions", json=HELLO, headers={**USER, "x-edge-max-wait-ms": "soon"}
    )
    assert openai_error(bad, 400)["param"] == "x-edge-max-wait-ms"


class SlowFirstChunkHandle(FakeChatHandle):
    """A chat replica whose first chunk takes a few event-loop rounds (a cold start)."""

    def _stream(self, request: Any) -> Any:
        stream = super()._stream(request)
        first = stream.__anext__

        async def slow_first() -> Any:
            stream.__anext__ = first  # type: ignore[method-assign]
            for _ in range(20):  # 4 times the slow moderation check's rounds (below)
                await asyncio.sleep(0)
            return await first()

        stream.__anext__ = slow_first  # type: ignore[method-assign]
        return stream


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**HELLO, "stream": True}),
        ("/ai/run/kimi", {"prompt": "hi", "stream": True}),
        ("/ai/run/@cf/moonshotai/kimi-k2.6", {"prompt": "hi", "stream": True}),
        ("/v1/completions", {"model": "kimi", "prompt": ["a", "b"], "stream": True}),
    ],
)
def test_a_stream_held_for_a_cold_start_says_it_is_warming(path: str, body: dict[str, Any]):
    with client_for(fake_handles(kimi=SlowFirstChunkHandle())) as client:
        response = client.post(path, json=body, headers=USER)
    assert response.status_code == 200
    lines = [line for line in response.text.splitlines() if line]
    assert lines[0].startswith(": warming region=")
    region, ready_in = lines[0].removeprefix(": warming region=").split(" ")
    assert region in {"eu", "us", "ap"}
    # when the replica is expected up, as a refusal's retry-after-ms would say
    assert ready_in.startswith("ready-in-ms=") and int(ready_in.split("=")[1]) > 0
    assert sse_data(response)[-1] == "[DONE]" and len(sse_data(response)) > 1
    assert "x-edge-region" not in response.headers  # not known when the response started
    (edge,) = [line for line in lines if line.startswith(": edge ")]  # ... so it follows here
    assert "x-edge-colo=" in edge and "x-edge-route-reason=" in edge


class SlowModerationHandle(FakeModerationHandle):
    """The moderation deployment, answering the gate's check after a few event-loop rounds."""

    async def _classify(self, request: Any) -> Any:
        for _ in range(5):
            await asyncio.sleep(0)
        return await super()._classify(request)


def test_a_refused_input_keeps_its_400_even_when_the_stream_would_wait_for_a_cold_start():
    """The gate checks the input (here by a call to the moderation deployment) while the
    dispatch starts; a stream waiting on a cold start is held (its response started) only once
    the input passed."""
    config = app_config(max_body_bytes=LIMIT)
    gate = config.security.moderation_gate.model_copy(update={"classifier": "deployment"})
    security = config.security.model_copy(update={"moderation_gate": gate})
    config = config.model_copy(update={"security": security})
    handles = fake_handles(kimi=SlowFirstChunkHandle(), moderation=SlowModerationHandle())
    with TestClient(make_app(config, services_for(config, handles, ENV))) as client:
        body = {"model": "kimi", "messages": [{"role": "user", "content": "darn"}], "stream": True}
        refused = client.post("/v1/chat/completions", json=body, headers=USER)
        fine = client.post(
            "/v1/chat/completions", json={**body, "messages": HELLO["messages"]}, headers=USER
        )
    assert openai_error(refused, 400)["code"] == "content_policy_violation"
    assert fine.text.startswith(": warming region=")  # held once the input passed


def test_two_apps_on_the_module_level_routers_each_answer_with_their_own_services():
    """The routes are module-level functions shared by every app; each reads the services of the
    app it serves (`app.state`), so one app's keys and models never answer for another's."""
    keyed, open_ = client_for(), client_for(env={})
    with keyed, open_:
        assert keyed.get("/v1/models").status_code == 401
        assert open_.get("/v1/models").status_code == 200
        assert keyed.get("/v1/models", headers=USER).status_code == 200
        assert keyed.get("/admin/colos", headers=ADMIN).status_code == 200
        assert open_.get("/admin/colos", headers=ADMIN).status_code == 404  # no admin key there
        for prefix in ("", "/accounts/acct/ai", "/client/v4/accounts/acct/ai"):
            assert keyed.post(f"{prefix}/v1/chat/completions", json=HELLO).status_code == 401
            answer = open_.post(f"{prefix}/v1/chat/completions", json=HELLO)
            assert answer.status_code == 200 and answer.json()["object"] == "chat.completion"
