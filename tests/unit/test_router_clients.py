"""The routes real clients call, on fake model handles (no Ray): Cloudflare's
account-scoped Workers AI paths with catalogue names, the OpenAI-compatible paths under them,
models/search, model retrieval, legacy completions and the x-ignored-fields header."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from router_fakes import FakeChatHandle, FakeStream, fake_handles, reply
from test_router_api import USER, client_for, envelope_error, openai_error, sse_data

from deployments.contracts.outputs import (
    Completion,
    GenerationChunk,
    PromptTokenLogprob,
    TokenLogprob,
)

GLM = "@cf/zai-org/glm-4.7-flash"
ACCOUNT_PATHS = ["/client/v4/accounts/acc-1/ai", "/accounts/acc-1/ai"]


@pytest.fixture
def client():
    with client_for() as test_client:
        yield test_client


@pytest.mark.parametrize("prefix", ACCOUNT_PATHS)
def test_workers_ai_run_with_a_catalogue_name(client: TestClient, prefix: str) -> None:
    answer = client.post(f"{prefix}/run/{GLM}", json={"prompt": "hi"}, headers=USER)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["success"] is True and body["errors"] == []
    # by its catalogue name, the record's shape: OpenAI's chat.completion
    assert body["result"]["choices"][0]["message"]["content"] == "hello from the fake model"
    embedded = client.post(
        f"{prefix}/run/@cf/sentence-transformers/all-minilm-l6-v2",
        json={"text": ["a", "b"]},
        headers=USER,
    ).json()["result"]
    assert embedded["shape"][0] == 2 and len(embedded["data"]) == 2
    (verdict,) = client.post(
        f"{prefix}/run/@cf/ray-edge-ai/profanity-check", json={"text": "darn"}, headers=USER
    ).json()["result"]
    assert (verdict["label"], verdict["score"], verdict["flagged"]) == ("FLAGGED", 0.9, True)


@pytest.mark.parametrize("prefix", ACCOUNT_PATHS)
def test_every_workers_ai_error_is_an_envelope(client: TestClient, prefix: str) -> None:
    assert "does not exist" in envelope_error(
        client.post(f"{prefix}/run/@cf/nobody/nothing", json={"prompt": "x"}, headers=USER), 404
    )
    unknown = envelope_error(
        client.post(f"{prefix}/run/{GLM}", json={"prompt": "x", "tempature": 1}, headers=USER), 400
    )
    assert "unknown field 'tempature'" in unknown and "temperature" in unknown
    envelope_error(client.post(f"{prefix}/run/{GLM}", json={"prompt": "x"}), 401)
    envelope_error(client.get(f"{prefix}/models/search?page=0", headers=USER), 400)
    # past the 64-bit integers a JSON encoder writes: a 400 envelope, not a 500 (found by fuzzing)
    envelope_error(client.get(f"{prefix}/models/search?page={2**64}", headers=USER), 400)


def test_the_openai_paths_under_an_account_answer_in_openai_shape(client: TestClient) -> None:
    base = "/client/v4/accounts/acc-1/ai/v1"
    chat = client.post(
        f"{base}/chat/completions",
        json={"model": GLM, "messages": [{"role": "user", "content": "hi"}]},
        headers=USER,
    )
    assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
    assert {m["id"] for m in client.get(f"{base}/models", headers=USER).json()["data"]} >= {"glm"}
    error = openai_error(
        client.post(
            f"{base}/chat/completions", json={"model": "nope", "messages": []}, headers=USER
        ),
        400,
    )
    assert error["param"] == "messages"


def test_models_search_pages_like_the_cloudflare_sdk_expects(client: TestClient) -> None:
    path = "/client/v4/accounts/acc-1/ai/models/search"
    everything = client.get(path, headers=USER).json()
    names = [m["name"] for m in everything["result"]]
    assert {GLM, "@cf/moonshotai/kimi-k2.6", "glm", "moderation"} <= set(names)
    assert everything["result_info"]["total_count"] == len(names)
    first = client.get(f"{path}?per_page=3&page=1", headers=USER).json()
    past = client.get(f"{path}?per_page=3&page=99", headers=USER).json()
    assert len(first["result"]) == 3 and past["result"] == []
    chat_only = client.get(f"{path}?task=Text Generation", headers=USER).json()["result"]
    assert {m["task"]["name"] for m in chat_only} == {"Text Generation"}
    assert [
        m["name"] for m in client.get(f"{path}?search=moonshotai", headers=USER).json()["result"]
    ] == ["@cf/moonshotai/kimi-k2.6"]


def test_retrieve_a_model_by_name_or_alias(client: TestClient) -> None:
    card = client.get(f"/v1/models/{GLM}", headers=USER).json()
    assert (card["id"], card["object"], card["aliases"]) == ("glm", "model", [GLM])
    moderation = client.get("/v1/models/moderation", headers=USER).json()
    assert moderation["categories"] == ["harassment", "profanity"]
    assert openai_error(client.get("/v1/models/gpt-9", headers=USER), 404)["param"] == "model"


def test_legacy_completions_plain_echo_and_stream(client: TestClient) -> None:
    body = {"model": "glm", "prompt": "Once upon", "echo": True, "n": 2, "max_tokens": 5}
    answer = client.post("/v1/completions", json=body, headers=USER).json()
    assert answer["object"] == "text_completion"
    assert [c["index"] for c in answer["choices"]] == [0, 1]
    assert answer["choices"][0]["text"] == "Once upon" + "hello from the fake model"
    streamed = client.post("/v1/completions", json={**body, "stream": True, "n": 1}, headers=USER)
    events = sse_data(streamed)
    assert events[-1] == "[DONE]"
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts) == "Once upon" + "hello from the fake model"
    suffix = openai_error(
        client.post("/v1/completions", json={**body, "suffix": "end"}, headers=USER), 400
    )
    assert (suffix["param"], suffix["code"]) == ("suffix", "unsupported_parameter")


def test_fields_openai_does_not_define_are_named_in_a_header(client: TestClient) -> None:
    body = {"model": "glm", "messages": [{"role": "user", "content": "hi"}]}
    plain = client.post("/v1/chat/completions", json={**body, "user": "u1"}, headers=USER)
    assert "x-ignored-fields" not in plain.headers  # user: ignored on purpose, documented
    extended = client.post(
        "/v1/chat/completions", json={**body, "vendor_hint": 1, "stream": True}, headers=USER
    )
    assert extended.headers["x-ignored-fields"] == "vendor_hint"
    # A name with a control character (found by fuzzing: it aborted the response) is encoded.
    odd = client.post("/v1/moderations", json={"input": "x", "\u001f": None}, headers=USER)
    assert odd.status_code == 200 and odd.headers["x-ignored-fields"] == "%1F"
    many = {f"f{i}": i for i in range(30)}
    flood = client.post("/v1/moderations", json={"input": "x", **many}, headers=USER)
    assert flood.headers["x-ignored-fields"].endswith("... (10 more)")


def test_the_chat_replica_gets_every_feature_of_the_request() -> None:
    glm = FakeChatHandle()
    with client_for(fake_handles(glm=glm)) as client:
        client.post(
            "/v1/chat/completions",
            json={
                "model": GLM,
                "messages": [{"role": "user", "content": "hi"}],
                "n": 2,
                "logprobs": True,
                "top_logprobs": 3,
                "frequency_penalty": 0.5,
                "logit_bias": {"7": 2},
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            headers=USER,
        )
    request = glm.complete.calls[-1]
    params, features = request.params, request.features
    assert (params.logprobs, params.top_logprobs, params.frequency_penalty) == (True, 3, 0.5)
    assert params.logit_bias == ((7, 2.0),)
    assert (features.n, features.tool_choice, features.tool_names) == (2, "required", ["f"])
    assert features.response_format == {"type": "json_object"}


class EchoingChatHandle(FakeChatHandle):
    """Answers each prompt with `re: <prompt>`, its prompt's logprobs when asked, and one
    logprob per generated piece: which answer belongs to which prompt is visible."""

    @staticmethod
    def _answers(messages, params, n) -> list[Completion]:
        prompt = messages[-1]["content"]
        text = f"re: {prompt}"
        return [
            Completion(
                text,
                "stop",
                prompt_tokens=len(prompt.split()),
                completion_tokens=2,
                index=i,
                logprobs=(TokenLogprob(text, text.encode(), -0.5),) if params.logprobs else None,
                prompt_logprobs=None if params.prompt_logprobs is None else _prompt_tokens(prompt),
            )
            for i in range(n)
        ]

    async def _complete(self, request):
        return reply(self._answers(request.messages, request.params, request.features.n))

    def _stream(self, request):
        chunks = [
            GenerationChunk(
                done.text,
                "stop",
                done.prompt_tokens,
                2 * (done.index + 1),
                index=done.index,
                logprobs=done.logprobs or (),
                prompt_logprobs=done.prompt_logprobs,
            )
            for done in self._answers(request.messages, request.params, request.features.n)
        ]
        return FakeStream(chunks, None, RuntimeError("unused"))


def _prompt_tokens(prompt: str) -> tuple[PromptTokenLogprob, ...]:
    words = prompt.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    return tuple(
        PromptTokenLogprob(p, p.encode(), None if i == 0 else -1.0 - i, ())
        for i, p in enumerate(pieces)
    )


def test_a_prompt_list_answers_each_prompt_n_times_indexed_as_openai():
    """LangChain's `OpenAI` LLM batches prompts in one request: choice c of prompt p is at
    index p * n + c, each prompt's own answer, usage summed."""
    glm = EchoingChatHandle()
    body = {"model": "glm", "prompt": ["one", "two words", "three more words"], "n": 2}
    with client_for(fake_handles(glm=glm)) as client:
        answer = client.post("/v1/completions", json=body, headers=USER).json()
        streamed = client.post("/v1/completions", json={**body, "stream": True}, headers=USER)
    texts = {c["index"]: c["text"] for c in answer["choices"]}
    assert texts == {
        0: "re: one",
        1: "re: one",
        2: "re: two words",
        3: "re: two words",
        4: "re: three more words",
        5: "re: three more words",
    }
    assert answer["usage"] == {
        "prompt_tokens": 6,
        "completion_tokens": 12,
        "total_tokens": 18,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert [call.messages[-1]["content"] for call in glm.complete.calls] == body["prompt"]
    events = [json.loads(e) for e in sse_data(streamed)[:-1]]
    assert {e["choices"][0]["index"]: e["choices"][0]["text"] for e in events} == texts


def test_echo_with_logprobs_shows_the_prompts_tokens_then_the_answers():
    glm = EchoingChatHandle()
    body = {"model": "glm", "prompt": "Once upon a", "echo": True, "logprobs": 1}
    with client_for(fake_handles(glm=glm)) as client:
        (choice,) = client.post("/v1/completions", json=body, headers=USER).json()["choices"]
        events = sse_data(
            client.post("/v1/completions", json={**body, "stream": True}, headers=USER)
        )
    assert glm.complete.calls[0].params.prompt_logprobs == 1  # asked of the replica
    logprobs = choice["logprobs"]
    assert choice["text"] == "Once upon a" + "re: Once upon a"
    assert logprobs["tokens"] == ["Once", " upon", " a", "re: Once upon a"]
    assert logprobs["token_logprobs"] == [None, -2.0, -3.0, -0.5]
    assert logprobs["top_logprobs"][0] is None and logprobs["top_logprobs"][1] == {}
    assert logprobs["text_offset"] == [0, 4, 9, len("Once upon a")]
    first, second = (json.loads(e)["choices"][0] for e in events[:2])
    assert first["text"] == "Once upon a" and first["logprobs"]["token_logprobs"] == [
        None,
        -2.0,
        -3.0,
    ]
    assert second["logprobs"]["text_offset"] == [len("Once upon a")]
    # Without echo, the prompt's logprobs are not asked for.
    client_body = {**body, "echo": False}
    with client_for(fake_handles(glm=glm)) as client:
        client.post("/v1/completions", json=client_body, headers=USER)
    assert glm.complete.calls[-1].params.prompt_logprobs is None
