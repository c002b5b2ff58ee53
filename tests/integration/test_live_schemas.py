"""The vendors' published schemas (tests/data) on the real replicas' answers: a chat completion
with n, logprobs and tools, a stream's every chunk, echoed prompt logprobs, the Workers AI names
in their catalogue records' shapes, models/search, an envelope error; and a stream held for a
cold start. The full matrix runs on fake handles in tests/unit/test_schemas.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import USER, wait_until
from schema_contracts import (
    assert_valid,
    catalogue_output_validator,
    envelope_validator,
    models_search_object_schema,
    openai_validator,
    sse_events,
)

GLM = "@cf/zai-org/glm-4.7-flash"
HI = [{"role": "user", "content": "Name a city."}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
RUN = "/client/v4/accounts/acc/ai/run"


@pytest.fixture(scope="module")
def http(serve_cluster) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=serve_cluster.base_url, timeout=180, headers=USER) as client:
        yield client


def _ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response


def test_chat_answers_and_every_chunk_are_openais(http: httpx.Client) -> None:
    body = {
        "model": "glm",
        "messages": HI,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 2,
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 40,
        "seed": 3,
    }
    answer = _ok(http.post("/v1/chat/completions", json=body)).json()
    assert_valid(openai_validator("CreateChatCompletionResponse"), answer, "a chat completion")
    assert all(c["message"]["tool_calls"] for c in answer["choices"])
    streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(_ok(http.post("/v1/chat/completions", json=streamed)).text)
    assert events[-1] == "[DONE]"
    chunk_schema = openai_validator("CreateChatCompletionStreamResponse")
    for number, chunk in enumerate(events[:-1]):
        assert_valid(chunk_schema, chunk, f"chunk {number}")
    heads = [
        call
        for chunk in events[:-1]
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls", [])
        if "id" in call
    ]
    assert len(heads) >= 2 and all(h["function"]["arguments"] == "" for h in heads)


def test_echoed_prompt_logprobs_are_the_replicas_own(http: httpx.Client) -> None:
    prompt = "Once upon a time"
    body = {"model": "glm", "prompt": [prompt, "A sea"], "echo": True, "logprobs": 2}
    answer = _ok(http.post("/v1/completions", json={**body, "max_tokens": 3})).json()
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    first = answer["choices"][0]
    logprobs = first["logprobs"]
    assert first["text"].startswith(prompt)
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    prompt_tokens = answer["usage"]["prompt_tokens"]
    assert len(logprobs["tokens"]) > prompt_tokens // 2  # the prompt's tokens, then the answer's
    assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])
    # The spec has no null there; OpenAI's answers do (tests/unit/test_schemas.py).
    for choice in answer["choices"]:
        choice["logprobs"]["token_logprobs"][0], choice["logprobs"]["top_logprobs"][0] = 0.0, {}
    assert_valid(openai_validator("CreateCompletionResponse"), answer, "a completion")


def test_workers_ai_names_answer_in_their_catalogue_records_shapes(http: httpx.Client) -> None:
    success = envelope_validator("api-response-common")
    alias = _ok(http.post(f"{RUN}/{GLM}", json={"prompt": "hi", "max_tokens": 8})).json()
    assert_valid(success, alias, "the envelope")
    assert_valid(catalogue_output_validator(GLM), alias["result"], "glm-4.7-flash's answer")
    classic = _ok(http.post(f"{RUN}/glm", json={"prompt": "hi", "max_tokens": 8})).json()
    assert_valid(catalogue_output_validator("glm"), classic["result"], "the classic answer")
    streamed = {"messages": HI, "max_tokens": 8, "stream": True}
    events = sse_events(_ok(http.post(f"{RUN}/{GLM}", json=streamed)).text)
    for number, chunk in enumerate(events[:-1]):
        assert_valid(openai_validator("CreateChatCompletionStreamResponse"), chunk, str(number))
    moderation = "@cf/ray-edge-ai/profanity-check"
    verdicts = _ok(http.post(f"{RUN}/{moderation}", json={"text": "a fine day"})).json()
    assert_valid(catalogue_output_validator(moderation), verdicts["result"], "a verdict list")
    search = http.get("/client/v4/accounts/acc/ai/models/search").json()
    assert_valid(envelope_validator("api-response-collection"), search, "the search envelope")
    record = type(success)(models_search_object_schema())
    for model in search["result"]:
        assert_valid(record, model, model["name"])
    missing = http.post(f"{RUN}/@cf/nobody/nothing", json={"prompt": "x"})
    assert missing.status_code == 404
    assert_valid(envelope_validator("api-response-common-failure"), missing.json(), "a 404")
    assert missing.json()["errors"][0]["code"] == 5007


def test_a_stream_waiting_for_a_cold_replica_says_it_is_warming(http, serve_cluster) -> None:
    """kimi goes back to zero a few seconds after its last request (the test config). The
    routers learn it from edge-control about a second after Serve: a try made before they did
    is served as warm (and waits in Serve's queue), so the test tries again, a few times."""
    body = {"model": "kimi", "messages": HI, "max_tokens": 4, "stream": True}
    tries: list[list[str]] = []
    for _ in range(3):
        wait_until(lambda: serve_cluster.running_replicas("kimi") == 0, 90, "kimi at zero")
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        tries.append(lines)
        assert lines[-1] == "data: [DONE]"
        if lines[0].startswith(": warming"):
            break
    held = tries[-1]
    assert held[0].startswith(": warming region="), [t[:2] for t in tries]
    # `: warming region=<region> ready-in-ms=<ms>`: the wait the client can expect, if known
    region, *estimate = held[0].removeprefix(": warming region=").split(" ")
    assert all(e.startswith("ready-in-ms=") and int(e.split("=")[1]) >= 0 for e in estimate)
    (edge,) = [line for line in held if line.startswith(": edge ")]
    assert "x-edge-cold-start=1" in edge and f"x-edge-region={region}" in edge
