"""Every route's answers against the vendors' published schemas (tests/data, provenance in its
README): OpenAI's spec on /v1, Cloudflare's v4 envelope and catalogue records on the Workers AI
paths. Plain, streamed (every event), n > 1, logprobs, tools, structured outputs and errors, on
fake handles (no Ray); tests/integration/test_live_schemas.py checks real replicas' answers."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from fastapi.testclient import TestClient
from router_fakes import (
    FakeChatHandle,
    ScriptedChatHandle,
    app_config,
    fake_handles,
    services_for,
)
from schema_contracts import (
    assert_valid,
    catalogue_output_validator,
    envelope_validator,
    models_search_object_schema,
    openai_validator,
    problems,
    sse_events,
)
from test_router_clients import EchoingChatHandle

from deployments.contracts.outputs import Completion, GenerationChunk, TokenLogprob, ToolCall
from deployments.ingress.api.app import make_app

LIMIT = 4096
KEY = "sk-user-0123456789abcdef"
USER = {"authorization": f"Bearer {KEY}"}
ENV = {"EDGE_API_KEYS": f"alice:{KEY}"}
HI = [{"role": "user", "content": "hi"}]
GLM, KIMI = "@cf/zai-org/glm-4.7-flash", "@cf/moonshotai/kimi-k2.6"
EMBEDDER, CLASSIFIER = (
    "@cf/sentence-transformers/all-minilm-l6-v2",
    "@cf/ray-edge-ai/profanity-check",
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}

TOKEN = TokenLogprob(
    "hel", b"hel", -0.25, (TokenLogprob("hel", b"hel", -0.25), TokenLogprob("yo", b"yo", -1.5))
)
CALL = ToolCall("call_0", "get_weather", '{"city": "Paris"}')
# Two choices: text with its tokens' logprobs, and a tool call (as the engine returns them)
RICH_COMPLETIONS = [
    Completion("hello", "stop", 7, 2, index=0, logprobs=(TOKEN, TOKEN)),
    Completion("", "tool_calls", 7, 6, index=1, logprobs=(), tool_calls=(CALL,)),
]
RICH_CHUNKS = [
    GenerationChunk("hel", None, 7, 1, index=0, logprobs=(TOKEN,)),
    GenerationChunk("", None, 7, 2, index=1),
    GenerationChunk("lo", "stop", 7, 3, index=0, logprobs=(TOKEN,)),
    GenerationChunk("", "tool_calls", 7, 8, index=1, tool_calls=(CALL,)),
]


def rich_handle() -> ScriptedChatHandle:
    return ScriptedChatHandle(RICH_COMPLETIONS, RICH_CHUNKS)


def client_for(**handles: Any) -> TestClient:
    config = app_config(max_body_bytes=LIMIT)
    services = services_for(config, fake_handles(**handles), ENV)
    return TestClient(make_app(config, services), raise_server_exceptions=False)


@pytest.fixture
def client() -> Iterator[TestClient]:
    with client_for() as test_client:
        yield test_client


@pytest.fixture
def rich() -> Iterator[TestClient]:
    """glm and kimi answer two choices: text with logprobs, and a tool call."""
    with client_for(glm=rich_handle(), kimi=rich_handle()) as test_client:
        yield test_client


def post(client: TestClient, path: str, body: Mapping[str, Any], status: int = 200) -> Any:
    response = client.post(path, json=body, headers=USER)
    assert response.status_code == status, response.text
    return response


def streamed(client: TestClient, path: str, body: Mapping[str, Any]) -> list[Any]:
    """A stream's events, checked to end with `[DONE]` and nothing after it."""
    events = sse_events(post(client, path, body).text)
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1], events
    return events[:-1]


# ---- OpenAI: chat completions -------------------------------------------------------------------

CHAT = openai_validator("CreateChatCompletionResponse")
CHUNK = openai_validator("CreateChatCompletionStreamResponse")
ERROR = openai_validator("ErrorResponse")

RICH_CHAT = {"messages": HI, "n": 2, "logprobs": True, "top_logprobs": 2, "tools": [WEATHER]}


@pytest.mark.parametrize(
    ("handles", "body"),
    [
        ({}, {"model": "glm", "messages": HI}),
        ({"glm": rich_handle()}, {"model": "glm", **RICH_CHAT}),
        (
            {"glm": FakeChatHandle(text='{"city": "Paris"}')},
            {
                "model": "glm",
                "messages": HI,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "city", "schema": WEATHER["function"]["parameters"]},
                },
            },
        ),
    ],
    ids=["plain", "n2-logprobs-tools", "structured"],
)
def test_a_chat_completion_is_valid(handles: dict[str, Any], body: dict[str, Any]):
    with client_for(**handles) as client:
        answer = post(client, "/v1/chat/completions", body).json()
    assert_valid(CHAT, answer, "a chat completion")
    assert all(choice["message"]["refusal"] is None for choice in answer["choices"])


@pytest.mark.parametrize(
    ("handles", "body"),
    [
        ({}, {"model": "kimi", "messages": HI, "stream_options": {"include_usage": True}}),
        ({"kimi": rich_handle()}, {"model": "kimi", **RICH_CHAT}),
        (
            {"kimi": rich_handle()},
            {"model": "kimi", **RICH_CHAT, "stream_options": {"include_usage": True}},
        ),
    ],
    ids=["plain-usage", "n2-logprobs-tools", "n2-logprobs-tools-usage"],
)
def test_every_chat_stream_chunk_is_valid(handles: dict[str, Any], body: dict[str, Any]):
    with client_for(**handles) as client:
        chunks = streamed(client, "/v1/chat/completions", {**body, "stream": True})
    for number, chunk in enumerate(chunks):
        assert_valid(CHUNK, chunk, f"chunk {number}")
    # Null is not an absent field: a delta never carries `role: null` or `tool_calls: null`,
    # and only the usage chunk has `usage`.
    for chunk in chunks:
        for choice in chunk["choices"]:
            assert None not in (
                choice["delta"].get("role", ""),
                choice["delta"].get("tool_calls", []),
            )
        assert ("usage" in chunk) == (chunk["choices"] == [])


def test_streamed_tool_calls_come_as_openai_deltas(rich: TestClient):
    """The first delta of a call has its index, id, type, name and empty arguments; then
    argument fragments with the index only; joined they are the call's arguments."""
    chunks = streamed(rich, "/v1/chat/completions", {"model": "glm", **RICH_CHAT, "stream": True})
    deltas = [
        call
        for chunk in chunks
        for choice in chunk["choices"]
        if choice["index"] == 1
        for call in choice["delta"].get("tool_calls", [])
    ]
    head, *fragments = deltas
    assert head == {
        "index": 0,
        "id": CALL.id,
        "type": "function",
        "function": {"name": CALL.name, "arguments": ""},
    }
    assert fragments and all(set(f) == {"index", "function"} for f in fragments)
    assert all(set(f["function"]) == {"arguments"} for f in fragments)
    assert "".join(f["function"]["arguments"] for f in fragments) == CALL.arguments
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes.count("tool_calls") == 1


def test_a_stream_that_fails_ends_with_a_valid_error_event():
    with client_for(kimi=FakeChatHandle(stream_fails_after=1)) as client:
        events = streamed(
            client, "/v1/chat/completions", {"model": "kimi", "messages": HI, "stream": True}
        )
    assert_valid(ERROR, events[-1], "the error event")
    for chunk in events[:-1]:
        assert_valid(CHUNK, chunk, "a chunk before the error")


# ---- OpenAI: legacy completions, embeddings, moderations, models --------------------------------

COMPLETION = openai_validator("CreateCompletionResponse")


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "Once"},
        {"prompt": "Once", "n": 2, "logprobs": 2},
        {"prompt": "Once", "echo": True},
    ],
    ids=["plain", "n2-logprobs", "echo"],
)
def test_a_legacy_completion_is_valid(rich: TestClient, body: dict[str, Any]):
    answer = post(rich, "/v1/completions", {"model": "glm", **body}).json()
    assert_valid(COMPLETION, answer, "a completion")


def test_prompt_lists_and_echoed_logprobs_are_valid_but_for_the_first_tokens_null():
    body = {"model": "glm", "prompt": ["a b", "c d e"], "n": 2, "echo": True, "logprobs": 2}
    with client_for(glm=EchoingChatHandle()) as client:
        answer = post(client, "/v1/completions", body).json()
        events = streamed(client, "/v1/completions", {**body, "stream": True})
    # Stricter than the service: the spec has no null in `token_logprobs` or `top_logprobs`,
    # yet OpenAI's echoed prompt starts with a null for its first token, which nothing precedes
    # (`"token_logprobs": [null, -5.6045575, ...]` in the events quoted at
    # community.openai.com/t/completion-finish-reason-is-missing-when-stream-true/90526).
    assert len(answer["choices"]) == 4
    for number, body_or_event in enumerate([answer, *events]):
        for choice in body_or_event["choices"]:
            logprobs = choice["logprobs"]
            if logprobs and logprobs["token_logprobs"][:1] == [None]:
                assert logprobs["top_logprobs"][0] is None
                assert choice["text"].startswith(tuple(body["prompt"]))  # an echoed prompt
                logprobs["token_logprobs"][0], logprobs["top_logprobs"][0] = 0.0, {}
            if choice["finish_reason"] is None and number > 0:
                choice["finish_reason"] = "stop"  # null until it ends, as above
        assert_valid(COMPLETION, body_or_event, f"answer or event {number}, but for those")


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "Once", "stream_options": {"include_usage": True}},
        {"prompt": "Once", "n": 2, "logprobs": 2, "echo": True},
    ],
    ids=["plain-usage", "n2-logprobs-echo"],
)
def test_every_legacy_completion_event_is_valid(rich: TestClient, body: dict[str, Any]):
    events = streamed(rich, "/v1/completions", {"model": "glm", "stream": True, **body})
    for number, event in enumerate(events):
        unfinished = {
            f"choices/{i}/finish_reason"
            for i, c in enumerate(event["choices"])
            if c["finish_reason"] is None
        }
        # Stricter than the service: the spec's `finish_reason` is never null, yet OpenAI's own
        # stream events carry `"finish_reason": null` until a choice ends (its events quoted in
        # community.openai.com/t/completion-finish-reason-is-missing-when-stream-true/90526),
        # and clients read that key; that one deviation is allowed, nothing else.
        for issue in problems(COMPLETION, event):
            assert issue.split(":")[0] in unfinished, f"event {number}: {issue}"
        assert event.get("usage", True) is not None  # absent or an object, never null


def test_embeddings_are_valid_and_base64_is_where_the_spec_is_stricter(client: TestClient):
    validator = openai_validator("CreateEmbeddingResponse")
    floats = post(client, "/v1/embeddings", {"model": "embedding", "input": ["a", "b"]}).json()
    assert_valid(validator, floats, "float embeddings")
    encoded = {"model": "embedding", "input": "a", "encoding_format": "base64"}
    base64 = post(client, "/v1/embeddings", encoded).json()
    # Stricter than the service: the spec types `embedding` as an array of numbers only, yet
    # OpenAI answers `encoding_format: base64` with a string, and its own Python SDK asks for
    # base64 by default and decodes that string (openai 3.51: lib/_parsing/_embeddings.py,
    # prepare_embedding_request).
    (issue,) = problems(validator, base64)
    assert issue.startswith("data/0/embedding:") and "is not of type 'array'" in issue


def test_moderations_and_models_are_valid(client: TestClient):
    moderated = post(client, "/v1/moderations", {"input": ["fine", "darn"]}).json()
    assert_valid(openai_validator("CreateModerationResponse"), moderated, "a moderation")
    models = client.get("/v1/models", headers=USER).json()
    assert_valid(openai_validator("ListModelsResponse"), models, "the model list")
    one = client.get(f"/v1/models/{GLM}", headers=USER).json()
    assert_valid(openai_validator("Model"), one, "a model")


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status"),
    [
        ("POST", "/v1/chat/completions", {"model": "glm"}, USER, 400),
        ("POST", "/v1/chat/completions", {"model": "gpt", "messages": HI}, USER, 404),
        ("POST", "/v1/chat/completions", {"model": "glm", "messages": HI}, {}, 401),
        ("GET", "/v1/embeddings", None, USER, 405),
        ("POST", "/v1/embeddings", {"model": "embedding", "input": "a" * LIMIT}, USER, 413),
        ("GET", "/v2/nothing", None, USER, 404),
    ],
)
def test_every_openai_error_is_valid(
    client: TestClient, method: str, path: str, body: Any, headers: Any, status: int
):
    response = client.request(method, path, json=body, headers=headers)
    assert response.status_code == status
    assert_valid(ERROR, response.json(), f"a {status}")


# ---- Workers AI: each name in its catalogue record's shape --------------------------------------

SUCCESS = envelope_validator("api-response-common")
FAILURE = envelope_validator("api-response-common-failure")
COLLECTION = envelope_validator("api-response-collection")


def run(client: TestClient, model: str, body: Mapping[str, Any], status: int = 200) -> Any:
    answer = post(client, f"/client/v4/accounts/acc/ai/run/{model}", body, status).json()
    assert_valid(SUCCESS if status == 200 else FAILURE, answer, f"the envelope of {model}")
    return answer


@pytest.mark.parametrize("alias", [GLM, KIMI])
@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "hi"},
        {"messages": HI, "n": 2, "logprobs": True, "top_logprobs": 2, "tools": [WEATHER]},
        {
            "messages": HI,
            "max_completion_tokens": 8,
            "stop": ["."],
            "tool_choice": "auto",
            "tools": [WEATHER],
        },
    ],
    ids=["prompt", "n2-logprobs-tools", "openai-fields"],
)
def test_a_chat_alias_answers_its_records_chat_completion(
    rich: TestClient, alias: str, body: dict[str, Any]
):
    result = run(rich, alias, body)["result"]
    assert_valid(catalogue_output_validator(alias), result, f"{alias}'s result")
    assert_valid(CHAT, result, f"{alias}'s result as OpenAI's chat.completion")
    assert result["object"] == "chat.completion" and result["model"] == alias


@pytest.mark.parametrize("alias", [GLM, KIMI])
def test_a_chat_alias_streams_chat_completion_chunks(rich: TestClient, alias: str):
    body = {"messages": HI, "n": 2, "logprobs": True, "tools": [WEATHER], "stream": True}
    events = streamed(rich, f"/client/v4/accounts/acc/ai/run/{alias}", body)
    for number, chunk in enumerate(events):
        assert_valid(CHUNK, chunk, f"{alias}'s chunk {number}")


@pytest.mark.parametrize("native", ["glm", "kimi"])
def test_a_native_chat_name_keeps_the_classic_shape(rich: TestClient, native: str):
    # The classic record's `response` is a string: a tool-call-only answer has "" there.
    classic = catalogue_output_validator(native)
    result = run(rich, native, {"messages": HI, "tools": [WEATHER]})["result"]
    assert_valid(classic, result, f"{native}'s classic result")
    assert set(result) <= {"response", "usage", "tool_calls"}
    # Streamed: the record gives the stream as opaque `text/event-stream`; each event is one
    # object of the classic shape (Workers AI sends `{"response": ...}` per event).
    events = streamed(rich, f"/ai/run/{native}", {"prompt": "hi", "stream": True})
    (json_answer,) = [branch for branch in classic.schema["oneOf"] if branch["type"] == "object"]
    event_validator = type(classic)(json_answer)
    for number, event in enumerate(events):
        assert_valid(event_validator, event, f"{native}'s event {number}")


@pytest.mark.parametrize("name", [EMBEDDER, "embedding"])
def test_embeddings_answer_the_text_embeddings_record(client: TestClient, name: str):
    result = run(client, name, {"text": ["a", "b"]})["result"]
    record = catalogue_output_validator(name)
    # Stricter than any answer can meet: the record's `oneOf` puts the answer beside an "Async
    # response" branch that requires nothing, so every object, Cloudflare's own answers
    # included, matches both. The answer is checked against its synchronous branch, and the
    # two-branch match is asserted to be the only complaint.
    (issue,) = problems(record, result)
    assert "is valid under each of" in issue
    (answer_branch,) = [b for b in record.schema["oneOf"] if b.get("title") != "Async response"]
    assert_valid(type(record)(answer_branch), result, f"{name}'s result")
    assert result["shape"] == [2, len(result["data"][0])]


@pytest.mark.parametrize("name", [CLASSIFIER, "moderation"])
def test_moderation_answers_the_text_classification_record(client: TestClient, name: str):
    result = run(client, name, {"text": "darn"})["result"]
    assert_valid(catalogue_output_validator(name), result, f"{name}'s result")


def test_models_search_lists_complete_catalogue_records(client: TestClient):
    answer = client.get("/client/v4/accounts/acc/ai/models/search", headers=USER).json()
    assert_valid(COLLECTION, answer, "the search envelope")
    search_object = type(SUCCESS)(models_search_object_schema())
    for record in answer["result"]:
        assert_valid(search_object, record, record["name"])
    tasks = {record["name"]: record["task"] for record in answer["result"]}
    # Our aliases name their catalogue records' tasks as Cloudflare does.
    assert tasks[GLM]["id"] == "c329a1f9-323d-4e91-b2aa-582dd4188d34"
    assert tasks[EMBEDDER]["name"] == "Text Embeddings"


# ---- Workers AI: errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "headers", "status"),
    [
        ("/ai/run/glm", {"max_tokens": 4}, USER, 400),
        ("/ai/run/glm", {"prompt": "hi", "bogus": 1}, USER, 400),
        ("/ai/run/nope", {"prompt": "hi"}, USER, 404),
        ("/ai/run/glm", {"prompt": "hi"}, {}, 401),
        ("/ai/run/glm", {"prompt": "a" * LIMIT}, USER, 413),
        ("/client/v4/accounts/acc/ai/nothing", {}, USER, 404),
    ],
)
def test_every_envelope_error_is_valid_with_a_cloudflare_code(
    client: TestClient, path: str, body: Any, headers: Any, status: int
):
    response = client.post(path, json=body, headers=headers)
    assert response.status_code == status, response.text
    answer = response.json()
    assert_valid(FAILURE, answer, f"a {status} envelope")
    (error,) = answer["errors"]
    assert isinstance(error["code"], int) and error["code"] >= 1000


def test_a_failing_workers_stream_ends_with_a_valid_envelope_event():
    with client_for(glm=FakeChatHandle(stream_fails_after=1)) as client:
        events = streamed(client, "/ai/run/glm", {"prompt": "hi", "stream": True})
    assert_valid(FAILURE, events[-1], "the error event")


# ---- prompt caching: the cached share of the prompt, where each contract has it ---------------

CACHED = [Completion("hello", "stop", 40, 2, cached_tokens=32)]
CACHED_CHUNKS = [
    GenerationChunk("hel", None, 40, 1, cached_tokens=32),
    GenerationChunk("lo", "stop", 40, 2, cached_tokens=32),
]


def test_the_prompt_tokens_a_replica_had_cached_are_in_every_usage_that_has_them():
    """OpenAI's `usage.prompt_tokens_details.cached_tokens` (answers and a stream's usage
    event), Workers AI's under the chat record's name; the classic text-generation record has
    no such field and gets none."""
    with client_for(kimi=ScriptedChatHandle(CACHED, CACHED_CHUNKS)) as client:
        answer = post(client, "/v1/chat/completions", {"model": "kimi", "messages": HI}).json()
        chunks = streamed(
            client,
            "/v1/chat/completions",
            {
                "model": "kimi",
                "messages": HI,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        legacy = post(client, "/v1/completions", {"model": "kimi", "prompt": "hi"}).json()
        workers = post(client, f"/ai/run/{KIMI}", {"messages": HI}).json()["result"]
        classic = post(client, "/ai/run/kimi", {"messages": HI}).json()["result"]
    assert_valid(CHAT, answer, "a chat completion")
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    assert_valid(CHUNK, chunks[-1], "the usage event")
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    assert_valid(COMPLETION, legacy, "a legacy completion")
    assert legacy["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    assert_valid(catalogue_output_validator(KIMI), workers, "Workers AI's Kimi answer")
    assert workers["usage"]["prompt_tokens_details"] == {"cached_tokens": 32}
    assert classic["usage"] == {"prompt_tokens": 40, "completion_tokens": 2, "total_tokens": 42}
