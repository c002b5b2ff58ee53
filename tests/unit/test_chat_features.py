"""The chat replica with n, response_format and tools: what reaches a client parses."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import jsonschema
import pytest

from deployments.contracts.chat_deployment import ChatRequest
from deployments.contracts.chat_features import ChatFeatures
from deployments.contracts.sampling_params import SamplingParams
from deployments.errors import InvalidRequestError
from deployments.replica.chat import ChatServer
from deployments.replica.engine.session import SessionConfig

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "mood": {"enum": ["calm", "stormy"]},
        "depths": {"type": "array", "items": {"type": "integer"}},
        "coast": {
            "type": "object",
            "properties": {"length_km": {"type": "number"}},
            "required": ["length_km"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "mood", "depths", "coast"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query", "limit"],
            "additionalProperties": False,
        },
    },
}
HELLO = [{"role": "user", "content": "Describe the sea."}]


@pytest.fixture(scope="module", params=["glm", "kimi"])
def server(request: pytest.FixtureRequest, models_root: Path):
    chat = ChatServer(str(models_root / request.param), SessionConfig(provider="cpu"))
    yield chat
    chat.runtime.close()


def test_json_schema_choices_validate(server: ChatServer) -> None:
    features = ChatFeatures(
        n=2, response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}}
    )
    reply = asyncio.run(
        server.complete_choices(
            ChatRequest(HELLO, SamplingParams(max_tokens=120, seed=3), None, features)
        )
    )
    assert [c.index for c in reply.value] == [0, 1]
    for choice in reply.value:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.text), SCHEMA)


def test_a_named_tool_is_called_with_valid_arguments_streamed_too(server: ChatServer) -> None:
    features = ChatFeatures(tools=(TOOL,), tool_choice="lookup")
    params = SamplingParams(max_tokens=150, seed=4)
    done = asyncio.run(server.complete(ChatRequest(HELLO, params, None, features))).value
    assert done.finish_reason == "tool_calls" and len(done.tool_calls) == 1
    call = done.tool_calls[0]
    assert call.name == "lookup"
    jsonschema.validate(json.loads(call.arguments), TOOL["function"]["parameters"])

    async def streamed() -> list:
        return [r.value async for r in server.stream(ChatRequest(HELLO, params, None, features))]

    chunks = asyncio.run(streamed())
    assert chunks[-1].finish_reason == "tool_calls"
    assert [c.arguments for c in chunks[-1].tool_calls] == [call.arguments]
    assert "".join(c.text for c in chunks).strip() == done.text.strip()


def test_a_tool_choice_naming_no_tool_is_a_client_error(server: ChatServer) -> None:
    features = ChatFeatures(tools=(TOOL,), tool_choice="nope")
    with pytest.raises(InvalidRequestError) as info:
        asyncio.run(
            server.complete(ChatRequest(HELLO, SamplingParams(max_tokens=5), None, features))
        )
    assert info.value.param == "tool_choice"


@pytest.mark.parametrize("max_tokens", [12, 64])
def test_a_required_call_is_always_a_call_even_when_max_tokens_cuts_it(
    server: ChatServer, max_tokens: int
) -> None:
    """OpenAI's answer to a forced call that `max_tokens` cuts: the call, its arguments' text as
    far as it came, finish_reason `length`; never the call's raw markup as content, never no
    call. 64 tokens hold a whole call in both families' formats."""
    features = ChatFeatures(tools=(TOOL,), tool_choice="required")
    params = SamplingParams(max_tokens=max_tokens, seed=4)
    done = asyncio.run(server.complete(ChatRequest(HELLO, params, None, features))).value
    assert done.text == ""
    (call,) = done.tool_calls
    assert call.name == "lookup"
    if max_tokens == 12:
        assert done.finish_reason == "length" and done.completion_tokens == max_tokens
        with pytest.raises(json.JSONDecodeError):
            json.loads(call.arguments)
    else:
        assert done.finish_reason == "tool_calls"
        jsonschema.validate(json.loads(call.arguments), TOOL["function"]["parameters"])

    async def streamed() -> list:
        return [r.value async for r in server.stream(ChatRequest(HELLO, params, None, features))]

    chunks = asyncio.run(streamed())
    assert chunks[-1].finish_reason == done.finish_reason
    assert "".join(c.text for c in chunks) == ""
    assert [(c.name, c.arguments) for c in chunks[-1].tool_calls] == [("lookup", call.arguments)]
