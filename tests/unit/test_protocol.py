"""The wire types: requests validate like OpenAI's (with one clear error naming the field), and
our responses parse with the official `openai` SDK, both its types and its real client."""

from __future__ import annotations

import base64
import json
import random
import struct
import subprocess
import sys
import uuid
from typing import Any

import httpx2
import numpy as np
import openai
import pytest
from openai._models import construct_type
from openai.lib._parsing._embeddings import parse_embedding_response
from openai.types import CreateEmbeddingResponse as SDKEmbeddingResponse
from openai.types import Model as SDKModel
from openai.types import ModerationCreateResponse as SDKModerationResponse
from openai.types.chat import ChatCompletion as SDKChatCompletion
from openai.types.chat import ChatCompletionChunk as SDKChatCompletionChunk
from pydantic import BaseModel, ValidationError

from deployments.errors import EmptyInputError, InvalidRequestError, InvalidUTF8Error
from deployments.ingress.api.responses import encode_json
from deployments.ingress.protocol import (
    WORKERS_INPUT_BY_TASK,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionRequest,
    Choice,
    ChoiceDelta,
    ChunkChoice,
    CreateEmbeddingResponse,
    EmbeddingList,
    EmbeddingRequest,
    ModelCard,
    ModelList,
    Moderation,
    ModerationCreateResponse,
    ModerationRequest,
    Usage,
    WorkersChatInput,
    WorkersEmbeddingInput,
    WorkersEmbeddingResult,
    WorkersModerationInput,
    chat_completion_id,
    chat_messages_as_dicts,
    created_timestamp,
    describe_validation_error,
    encode_embedding_base64,
    ensure_utf8,
    error_envelope,
    make_id,
    moderation_id,
    ok_envelope,
    request_error_from_validation,
    workers_chat_to_chat_request,
    workers_embedding_result,
)
from deployments.ingress.protocol.moderations import OPENAI_CATEGORIES

HELLO = [{"role": "user", "content": "hello"}]
LONE_SURROGATE = "ok \ud800"
REQUEST_MODELS: list[type[BaseModel]] = [
    ChatCompletionRequest,
    EmbeddingRequest,
    ModerationRequest,
    WorkersChatInput,
    WorkersEmbeddingInput,
    WorkersModerationInput,
]


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "glm", "messages": HELLO} | fields)


def validation_problem(model: type[BaseModel], body: dict[str, Any]):
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    return describe_validation_error(caught.value)


# ---- chat requests ---------------------------------------------------------------------------


def test_chat_request_defaults_and_properties():
    request = chat()
    assert (request.n, request.stream, request.temperature, request.top_p) == (1, False, 1.0, 1.0)
    assert request.effective_max_tokens is None
    assert request.stop_sequences == ()
    assert request.include_usage is False
    assert request.ignored_fields() == []


def test_chat_request_full():
    request = chat(
        max_tokens=10,
        max_completion_tokens=20,
        temperature=0,
        top_p=0.5,
        stop="END",
        seed=-7,
        stream=True,
        stream_options={"include_usage": True},
    )
    assert request.effective_max_tokens == 20
    assert chat(max_tokens=10).effective_max_tokens == 10
    assert request.stop_sequences == ("END",)
    assert chat(stop=["a", "b", "c", "d"]).stop_sequences == ("a", "b", "c", "d")
    assert request.include_usage is True
    assert request.seed == -7


@pytest.mark.parametrize(
    ("fields", "param", "fragment"),
    [
        ({"n": 9}, "n", "less than or equal to 8"),
        ({"audio": {"voice": "x"}}, "audio", "'audio' is an OpenAI parameter"),
        ({"top_logprobs": 3}, "top_logprobs", "requires logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs", "less than or equal to 20"),
        ({"logit_bias": {"abc": 1}}, "logit_bias", "keys must be token ids"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "between -100 and 100"),
        ({"frequency_penalty": 3}, "frequency_penalty", "less than or equal to 2"),
        ({"tool_choice": "required"}, "tool_choice", "only allowed with tools"),
        (
            {"response_format": {"type": "json_schema"}},
            "response_format",
            "json_schema is required",
        ),
        ({"temperature": 3}, "temperature", "less than or equal to 2"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"messages": []}, "messages", "at least 1 item"),
        ({"messages": [{"role": "bot", "content": "x"}]}, "messages.0.role", "'system'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages.0.content",
            "only text content is supported",
        ),
        ({"stop": ["s"] * 5}, "stop", "at most 4"),
        ({"stop": ["ok", ""]}, "stop", "sequence 1 must be a non-empty string"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "greater than or equal to 1"),
        ({"messages": [{"role": "user"}]}, "messages.0", "content is required for role 'user'"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content", "a string or"),
        ({"messages": [{"role": "user", "content": []}]}, "messages.0.content", "empty list"),
        (
            {"messages": [{"role": "user", "content": [{"text": "x"}]}]},
            "messages.0.content.0.type",
            "Field required",
        ),
        ({"model": None}, "model", "Input should be a valid string"),
        ({"max_tokens": True}, "max_tokens", "valid integer"),
        ({"stream": "yes"}, "stream", "valid boolean"),
    ],
)
def test_invalid_chat_request_names_the_field(fields, param, fragment):
    problem = validation_problem(
        ChatCompletionRequest, {"model": "glm", "messages": HELLO} | fields
    )
    assert problem.param == param
    assert problem.message.startswith(f"{param}: ")
    assert fragment in problem.message


def test_text_parts_are_joined_and_developer_plays_system():
    request = chat(
        messages=[
            {"role": "developer", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "assistant", "content": None, "tool_calls": []},
            {"role": "tool", "content": "42", "name": "calc"},
        ]
    )
    assert chat_messages_as_dicts(request) == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "42"},
    ]


def test_unknown_fields_are_accepted_ignored_and_reported():
    request = chat(
        user="u-1",
        store=True,
        logit_bias={"50256": -100},
        frequency_penalty=0.5,
        messages=[{"role": "user", "content": [{"type": "text", "text": "x", "cache": 1}], "x": 1}],
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
        vendor_extension={"a": 1},
    )
    # OpenAI's own fields are honoured (penalties, bias) or ignored on purpose (user, store):
    # only what OpenAI does not define is reported.
    assert request.ignored_fields() == [
        "messages.0.content.0.cache",
        "messages.0.x",
        "stream_options.include_obfuscation",
        "vendor_extension",
    ]
    assert request.logit_bias == {"50256": -100.0} and request.frequency_penalty == 0.5
    # Ignored means ignored: nothing of them is kept or dumped.
    assert "user" not in request.model_dump()
    assert "x" not in request.messages[0].model_dump()


def test_null_means_not_given():
    request = chat(
        temperature=None, top_p=None, n=None, stream=None, stop=None, stream_options=None
    )
    assert (request.temperature, request.top_p, request.n, request.stream) == (1.0, 1.0, 1, False)
    assert request.ignored_fields() == []


def test_lone_surrogates_are_refused_everywhere_text_enters():
    assert ensure_utf8("héllo ✓") == "héllo ✓"
    cases = [
        (
            ChatCompletionRequest,
            {"model": "m", "messages": [{"role": "user", "content": LONE_SURROGATE}]},
        ),
        (ChatCompletionRequest, {"model": "m", "messages": HELLO, "stop": [LONE_SURROGATE]}),
        (EmbeddingRequest, {"model": "m", "input": ["fine", LONE_SURROGATE]}),
        (ModerationRequest, {"input": LONE_SURROGATE}),
        (WorkersChatInput, {"prompt": LONE_SURROGATE}),
    ]
    for model, body in cases:
        with pytest.raises(ValidationError) as caught:
            model.model_validate(body)
        assert caught.value.errors()[0]["type"] == "invalid_utf8", model
        assert len(caught.value.errors()) == 1, caught.value.errors()
        assert isinstance(request_error_from_validation(caught.value), InvalidUTF8Error)


# ---- embeddings and moderations requests -----------------------------------------------------


def test_embedding_request():
    request = EmbeddingRequest.model_validate(
        {"model": "minilm", "input": "one", "dimensions": 384}
    )
    assert request.texts == ["one"]
    assert (request.encoding_format, request.dimensions) == ("float", 384)
    assert EmbeddingRequest(model="m", input=["a", "b"]).texts == ["a", "b"]


@pytest.mark.parametrize("model", [EmbeddingRequest, ModerationRequest])
@pytest.mark.parametrize(
    ("value", "fragment", "error_class"),
    [
        ("", "empty string", EmptyInputError),
        ([], "empty list", EmptyInputError),
        (["a", ""], "item 1 is empty", EmptyInputError),
        ([1, 2, 3], "token arrays are not supported", InvalidRequestError),
        ([[1, 2], [3]], "check_embedding_ctx_length=False", InvalidRequestError),
        (["a", 5], "item 1 must be a string", InvalidRequestError),
        ({"text": "a"}, "a string or a list of strings", InvalidRequestError),
    ],
)
def test_invalid_text_input(model, value, fragment, error_class):
    with pytest.raises(ValidationError) as caught:
        model.model_validate({"model": "m", "input": value})
    problem = describe_validation_error(caught.value)
    assert problem.param == "input"
    assert fragment in problem.message
    assert type(request_error_from_validation(caught.value)) is error_class


def test_embedding_input_count_is_capped():
    problem = validation_problem(EmbeddingRequest, {"model": "m", "input": ["a"] * 2049})
    assert problem.param == "input" and "at most 2048" in problem.message


def test_moderation_request_defaults():
    request = ModerationRequest.model_validate({"input": ["a", "b"]})
    assert (request.model, request.texts) == ("moderation", ["a", "b"])


# ---- errors ----------------------------------------------------------------------------------


def test_fastapi_style_errors_drop_the_body_prefix_and_union_tags():
    errors = [
        {"type": "string_type", "loc": ("body", "messages", 0, "content", "str"), "msg": "bad"},
        {
            "type": "list_type",
            "loc": ("body", "messages", 0, "content", "list[TextContentPart]"),
            "msg": "worse",
        },
        {"type": "missing", "loc": ("body", "model"), "msg": "Field required"},
        {"type": "missing", "loc": ("body", "x"), "msg": "Field required"},
        {"type": "missing", "loc": ("body", "y"), "msg": "Field required"},
    ]
    problem = describe_validation_error(errors)
    assert problem.param == "messages.0.content"
    assert problem.message == (
        "messages.0.content: bad; messages.0.content: worse; model: Field required (and 2 more)"
    )


def test_invalid_json_and_whole_body_errors_have_no_param():
    invalid = [
        {
            "type": "json_invalid",
            "loc": ("body", 7),
            "msg": "JSON decode error",
            "ctx": {"error": "Expecting value"},
        }
    ]
    problem = describe_validation_error(invalid)
    assert (problem.param, problem.message) == (
        None,
        "the request body is not valid JSON: Expecting value",
    )
    not_an_object = validation_problem(ChatCompletionRequest, [])  # type: ignore[arg-type]
    assert not_an_object.param is None


# ---- responses through the openai SDK's own types --------------------------------------------


def seeded_uuid(seed: int):
    rng = random.Random(seed)
    return lambda: uuid.UUID(int=rng.getrandbits(128))


def test_ids_and_timestamps_are_injectable():
    assert chat_completion_id(seeded_uuid(1)) == chat_completion_id(seeded_uuid(1))
    assert chat_completion_id(seeded_uuid(1)) != chat_completion_id(seeded_uuid(2))
    assert chat_completion_id().startswith("chatcmpl-") and len(chat_completion_id()) == 9 + 32
    assert moderation_id().startswith("modr-")
    assert make_id("x", lambda: uuid.UUID(int=255)) == "x-" + "0" * 30 + "ff"
    assert created_timestamp(lambda: 1_700_000_000.9) == 1_700_000_000


def a_completion(content: str = "Hi there") -> ChatCompletion:
    return ChatCompletion(
        id=chat_completion_id(seeded_uuid(0)),
        created=1_700_000_000,
        model="glm",
        choices=[
            Choice(index=0, message=ChatCompletionMessage(content=content), finish_reason="length")
        ],
        usage=Usage.from_counts(5, 3),
    )


def stream_chunks(include_usage: bool) -> list[ChatCompletionChunk]:
    common = {"id": "chatcmpl-1", "created": 1_700_000_000, "model": "glm"}
    chunks = [
        ChatCompletionChunk(
            **common,
            choices=[ChunkChoice(index=0, delta=ChoiceDelta(role="assistant", content=""))],
        ),
        *(
            ChatCompletionChunk(
                **common, choices=[ChunkChoice(index=0, delta=ChoiceDelta(content=t))]
            )
            for t in ("Hel", "lo")
        ),
        ChatCompletionChunk(
            **common, choices=[ChunkChoice(index=0, delta=ChoiceDelta(), finish_reason="stop")]
        ),
    ]
    if include_usage:
        chunks.append(ChatCompletionChunk(**common, choices=[], usage=Usage.from_counts(4, 2)))
    return chunks


def test_chat_completion_parses_with_sdk_types():
    ours = a_completion()
    sdk = SDKChatCompletion.model_validate(ours.model_dump(mode="json"))
    assert sdk.object == "chat.completion"
    assert sdk.choices[0].message.content == "Hi there"
    assert sdk.choices[0].message.role == "assistant"
    assert sdk.choices[0].finish_reason == "length"
    assert (sdk.usage.prompt_tokens, sdk.usage.completion_tokens, sdk.usage.total_tokens) == (
        5,
        3,
        8,
    )
    assert json.loads(ours.model_dump_json()) == ours.model_dump(mode="json")


def test_usage_adds_up():
    assert Usage.from_counts(7, 2).total_tokens == 9


def test_chunks_parse_with_sdk_types():
    parsed = [
        SDKChatCompletionChunk.model_validate(c.model_dump(mode="json"))
        for c in stream_chunks(True)
    ]
    assert parsed[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parsed[:-1]) == "Hello"
    assert parsed[-2].choices[0].finish_reason == "stop"
    assert parsed[-1].choices == [] and parsed[-1].usage.total_tokens == 6
    assert all(p.object == "chat.completion.chunk" for p in parsed)


def test_embedding_response_parses_with_sdk_types():
    vectors = np.random.default_rng(0).standard_normal((2, 384)).astype(np.float32)
    for encoding in ("float", "base64"):
        # The bytes the router sends: the body built from the matrix, encoded by its encoder.
        body = json.loads(encode_json(EmbeddingList(vectors, "minilm", 6, encoding).body()))
        CreateEmbeddingResponse.model_validate(body)  # the schema /openapi.json documents
        if encoding == "float":
            sdk = SDKEmbeddingResponse.model_validate(body)
            # Each float reads back (as float64, then float32) as exactly the replica's value.
            assert np.array_equal(
                np.array([d.embedding for d in sdk.data], dtype=np.float32), vectors
            )
        else:
            # The SDK types `embedding` as list[float] only: strict validation refuses base64, so
            # its client builds the object leniently and then decodes.
            with pytest.raises(ValidationError):
                SDKEmbeddingResponse.model_validate(body)
            sdk = construct_type(type_=SDKEmbeddingResponse, value=body)
        # The SDK decodes base64 itself only when the caller did not choose a format.
        decoded = parse_embedding_response(sdk, encoding_format=openai.omit)
        assert np.array_equal(
            np.array([d.embedding for d in decoded.data], dtype=np.float32), vectors
        )
        assert [d.index for d in decoded.data] == [0, 1] and decoded.usage.total_tokens == 6
        assert body["object"] == "list" and body["model"] == "minilm"


def test_base64_is_little_endian_float32():
    vector = [0.1, -2.5, 3.0e-8, 1.0e30]
    encoded = encode_embedding_base64(vector)
    raw = base64.b64decode(encoded)
    assert len(raw) == 4 * len(vector)
    assert np.array_equal(np.frombuffer(raw, dtype="<f4"), np.array(vector, dtype=np.float32))
    assert raw[:4] == struct.pack("<f", 0.1)  # little-endian whatever the host
    assert encode_embedding_base64(np.array(vector, dtype=np.float64)) == encoded


def test_model_cards_parse_with_sdk_types():
    card = ModelCard(id="minilm", created=0, task="embedding", family="bert")
    sdk = SDKModel.model_validate(card.model_dump(mode="json"))
    assert (sdk.id, sdk.object, sdk.owned_by) == ("minilm", "model", "ray-edge-ai")
    assert ModelList(data=[card]).model_dump()["object"] == "list"


def a_moderation_response() -> ModerationCreateResponse:
    verdict = Moderation.from_scores(
        {"profanity": 0.9, "harassment": 0.9}, {"profanity": True, "harassment": True}
    )
    return ModerationCreateResponse(
        id=moderation_id(seeded_uuid(0)), model="moderation", results=[verdict]
    )


def test_moderation_from_scores():
    verdict = Moderation.from_scores({"b": 0.2, "a": 0.7}, {"b": False, "a": True})
    assert verdict.flagged is True
    assert list(verdict.categories) == sorted({"a", "b", *OPENAI_CATEGORIES})  # stable bytes
    applied = verdict.category_applied_input_types or {}
    assert applied["a"] == applied["b"] == ["text"] and applied["hate"] == []
    assert verdict.categories["hate"] is False and verdict.category_scores["hate"] == 0.0
    assert Moderation.from_scores({"a": 0.1}, {"a": False}).flagged is False
    with pytest.raises(ValueError):
        Moderation.from_scores({"a": 0.1}, {"b": False})


def test_moderation_response_parses_as_the_sdk_client_does():
    body = a_moderation_response().model_dump(mode="json")
    # The client builds responses with construct_type (no strict validation) by default.
    sdk = construct_type(type_=SDKModerationResponse, value=body)
    result = sdk.results[0]
    assert result.flagged is True
    assert result.categories.harassment is True and result.categories.profanity is True
    assert result.category_scores.harassment == pytest.approx(0.9)
    # OpenAI's categories we do not judge are present and false, as the SDK's types require.
    assert result.categories.hate is False and result.category_scores.hate == 0.0


def test_strict_sdk_validation_finds_all_thirteen_openai_categories():
    body = a_moderation_response().model_dump(mode="json")
    result = SDKModerationResponse.model_validate(body).results[0]
    assert result.categories.self_harm_intent is False
    assert result.category_applied_input_types.violence == []
    assert result.category_applied_input_types.harassment == ["text"]


# ---- the real SDK client against a fake server built on our types ----------------------------


def fake_server(request: httpx2.Request) -> httpx2.Response:
    body = json.loads(request.content) if request.content else {}
    path = request.url.path
    if path.endswith("/chat/completions"):
        parsed = ChatCompletionRequest.model_validate(body)
        if parsed.stream:
            events = [
                f"data: {c.model_dump_json()}\n\n" for c in stream_chunks(parsed.include_usage)
            ]
            return httpx2.Response(
                200,
                content="".join(events) + "data: [DONE]\n\n",
                headers={"content-type": "text/event-stream"},
            )
        return httpx2.Response(
            200, json=a_completion(parsed.messages[-1].text).model_dump(mode="json")
        )
    if path.endswith("/embeddings"):
        parsed = EmbeddingRequest.model_validate(body)
        vectors = np.stack([np.full(4, len(text), dtype=np.float32) / 3 for text in parsed.texts])
        response = EmbeddingList(vectors, parsed.model, 2, parsed.encoding_format)
        return httpx2.Response(
            200, content=encode_json(response.body()), headers={"content-type": "application/json"}
        )
    if path.endswith("/moderations"):
        ModerationRequest.model_validate(body)
        return httpx2.Response(200, json=a_moderation_response().model_dump(mode="json"))
    if path.endswith("/models"):
        cards = ModelList(data=[ModelCard(id="glm", created=0, task="chat", family="glm")])
        return httpx2.Response(200, json=cards.model_dump(mode="json"))
    return httpx2.Response(404, json={"error": {"message": path}})


@pytest.fixture(scope="module")
def client() -> openai.OpenAI:
    transport = httpx2.MockTransport(fake_server)
    return openai.OpenAI(
        api_key="unused",
        base_url="http://edge.test/v1",
        max_retries=0,
        http_client=httpx2.Client(transport=transport),
    )


def test_sdk_client_chat(client):
    completion = client.chat.completions.create(model="glm", messages=HELLO, user="someone")
    assert completion.choices[0].message.content == "hello"
    stream = client.chat.completions.create(
        model="glm", messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert chunks[-1].usage.total_tokens == 6


def test_sdk_client_embeddings_default_to_base64_and_decode(client):
    # Without encoding_format the SDK asks for base64 and decodes it with numpy.
    default = client.embeddings.create(model="minilm", input=["ab", "abcd"])
    floats = client.embeddings.create(model="minilm", input=["ab", "abcd"], encoding_format="float")
    expected = [np.full(4, n, dtype=np.float32) / 3 for n in (2, 4)]
    for response in (default, floats):
        assert np.array_equal(
            np.array([d.embedding for d in response.data], dtype=np.float32), expected
        )


def test_sdk_client_moderations_and_models(client):
    result = client.moderations.create(input=["you fool"]).results[0]
    assert result.flagged and result.categories.profanity is True
    models = client.models.list()
    assert [m.id for m in models] == ["glm"]
    assert models.data[0].task == "chat"  # our extension survives as an extra attribute


# ---- schemas ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model", REQUEST_MODELS)
def test_request_json_schema(model):
    schema = model.model_json_schema()
    assert schema["type"] == "object" and schema["properties"]
    json.dumps(schema)


def test_openapi_schema_via_fastapi():
    import fastapi

    app = fastapi.FastAPI()
    for index, (request_model, response_model) in enumerate(
        [
            (ChatCompletionRequest, ChatCompletion),
            (EmbeddingRequest, CreateEmbeddingResponse),
            (ModerationRequest, ModerationCreateResponse),
            (WorkersChatInput, None),
        ]
    ):

        def endpoint(body: Any) -> None:
            return None

        # This module's annotations are strings; give FastAPI the class itself.
        endpoint.__annotations__["body"] = request_model
        app.post(f"/e{index}", response_model=response_model)(endpoint)
    schemas = app.openapi()["components"]["schemas"]
    chat_schema = schemas["ChatCompletionRequest"]["properties"]
    assert chat_schema["n"]["maximum"] == 8
    assert chat_schema["temperature"]["maximum"] == 2
    assert schemas["ChatCompletionRequest"]["properties"]["messages"]["minItems"] == 1
    assert {"ChatMessage", "TextContentPart", "Usage", "Choice"} <= set(schemas)


def test_through_fastapi_errors_describe_the_same_way_and_ignored_fields_are_kept():
    import fastapi
    from fastapi.exceptions import RequestValidationError
    from fastapi.testclient import TestClient

    app = fastapi.FastAPI()
    problems: list[InvalidRequestError] = []
    ignored: list[list[str]] = []

    @app.exception_handler(RequestValidationError)
    async def handler(request, exc):  # noqa: ARG001
        problems.append(request_error_from_validation(exc.errors()))
        return fastapi.responses.JSONResponse({}, status_code=400)

    @app.post("/v1/chat/completions")
    def endpoint(body: ChatCompletionRequest) -> None:
        ignored.append(body.ignored_fields())

    json_body = {"content-type": "application/json"}
    with TestClient(app) as test_client:
        post = test_client.post
        assert (
            post(
                "/v1/chat/completions", json={"model": "m", "messages": HELLO, "n": 30}
            ).status_code
            == 400
        )
        post("/v1/chat/completions", content=b"{not json", headers=json_body)
        # FastAPI decodes with json.loads, which lets a lone surrogate through to our validator.
        raw = b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}'
        post("/v1/chat/completions", content=raw, headers=json_body)
        ok = post("/v1/chat/completions", json={"model": "m", "messages": HELLO, "userx": "u"})
        assert ok.status_code == 200
    n_error, json_error, utf8_error = problems
    assert (n_error.param, n_error.message) == ("n", "n: Input should be less than or equal to 8")
    assert json_error.param is None and "not valid JSON" in json_error.message
    assert isinstance(utf8_error, InvalidUTF8Error) and utf8_error.param == "messages.0.content"
    assert ignored == [["userx"]]


# ---- Workers AI ------------------------------------------------------------------------------


def test_workers_chat_prompt_or_messages():
    assert WorkersChatInput.model_validate({"prompt": "hi"}).prompt == "hi"
    assert WorkersChatInput.model_validate({"messages": HELLO}).messages[0].content == "hello"
    for body in ({}, {"prompt": "hi", "messages": HELLO}):
        problem = validation_problem(WorkersChatInput, body)
        assert (
            problem.param == "messages" and "exactly one of prompt or messages" in problem.message
        )
    assert validation_problem(WorkersChatInput, {"prompt": ""}).param == "prompt"
    assert validation_problem(WorkersChatInput, {"prompt": "x", "stop": ["a"] * 5}).param == "stop"


def test_workers_chat_converts_only_what_was_set():
    request = workers_chat_to_chat_request(
        "glm",
        WorkersChatInput.model_validate(
            {"prompt": "hi", "max_tokens": 5, "stop": "x", "raw": True}
        ),
    )
    assert chat_messages_as_dicts(request) == [{"role": "user", "content": "hi"}]
    assert (request.model, request.effective_max_tokens, request.stop_sequences) == (
        "glm",
        5,
        ("x",),
    )
    assert (request.temperature, request.top_p, request.stream) == (1.0, 1.0, False)
    streamed = workers_chat_to_chat_request(
        "glm",
        WorkersChatInput.model_validate({"messages": HELLO, "stream": True, "temperature": 0}),
    )
    assert (streamed.stream, streamed.temperature, streamed.messages[0].text) == (
        True,
        0.0,
        "hello",
    )


def test_workers_inputs_by_task():
    assert set(WORKERS_INPUT_BY_TASK) == {"chat", "embedding", "moderation"}
    assert WORKERS_INPUT_BY_TASK["embedding"].model_validate({"text": ["a", "b"]}).texts == [
        "a",
        "b",
    ]
    assert WORKERS_INPUT_BY_TASK["moderation"].model_validate({"text": "a"}).texts == ["a"]
    assert validation_problem(WorkersEmbeddingInput, {"text": [1, 2]}).param == "text"


def test_workers_envelopes():
    result = workers_embedding_result(np.full((2, 3), 0.1, dtype=np.float32))
    body = json.loads(encode_json(ok_envelope(result)))
    WorkersEmbeddingResult.model_validate(body["result"])  # the documented schema
    assert np.array_equal(np.array(body["result"]["data"], dtype=np.float32), result["data"])
    assert body == {
        "result": {"shape": [2, 3], "data": [[0.1] * 3] * 2},
        "success": True,
        "errors": [],
        "messages": [],
    }
    assert error_envelope(InvalidRequestError("bad input")) == {
        "result": None,
        "success": False,
        "errors": [{"code": 9100, "message": "bad input"}],
        "messages": [],
    }
    assert json.dumps(ok_envelope([a_moderation_response().results[0]]))
    with pytest.raises(ValueError):
        workers_embedding_result(np.ones(3))


def test_protocol_imports_neither_ray_nor_fastapi():
    code = (
        "import sys, deployments.ingress.protocol; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'fastapi', 'starlette'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
