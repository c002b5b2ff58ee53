"""The chat wire types for logprobs, tools, response formats and n: requests parse into what the
engine needs, responses parse with the official `openai` SDK's strict types."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from openai.types.chat import ChatCompletion as SDKChatCompletion
from openai.types.chat import ChatCompletionChunk as SDKChatCompletionChunk
from pydantic import ValidationError

from deployments.errors import UnsupportedParameterError
from deployments.ingress.protocol import request_error_from_validation
from deployments.ingress.protocol.chat import ChatCompletionRequest, chat_messages_as_dicts
from deployments.ingress.protocol.chat_response import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionMessageToolCall,
    Choice,
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceLogprobs,
    ChunkChoice,
)
from deployments.ingress.protocol.common import Usage

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "find things",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}


@dataclass(frozen=True)
class Token:  # the engine's record, as the protocol reads it
    token: str
    token_bytes: bytes
    logprob: float
    top_logprobs: tuple = ()


@dataclass(frozen=True)
class Call:
    id: str
    name: str
    arguments: str


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "glm", "messages": [{"role": "user", "content": "hi"}], **fields}
    )


def test_tools_tool_choice_and_response_format_parse() -> None:
    req = request(
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": True},
        },
        n=3,
        logprobs=True,
        top_logprobs=5,
        parallel_tool_calls=False,
    )
    assert req.tool_choice_name == "lookup"
    assert req.tool_dicts[0]["function"]["name"] == "lookup"
    assert req.response_format is not None
    assert req.response_format.as_dict() == {
        "type": "json_schema",
        "json_schema": {"schema": {"type": "object"}},
    }
    assert request(tools=[TOOL]).tool_choice_name == "auto"
    assert request().tool_choice_name == "none"


def test_a_named_tool_must_exist() -> None:
    with pytest.raises(ValidationError, match="not among the tools"):
        request(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "nope"}})


@pytest.mark.parametrize("name", ["audio", "functions", "prediction", "reasoning_effort"])
def test_unhonoured_openai_parameters_are_named_400s(name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        request(**{name: {"anything": 1}})
    error = request_error_from_validation(caught.value)
    assert isinstance(error, UnsupportedParameterError)
    assert (error.param, error.code, error.status) == (name, "unsupported_parameter", 400)
    assert request(**{name: None}).ignored_fields() == []  # null means not given


def test_past_tool_calls_and_results_reach_the_template() -> None:
    req = ChatCompletionRequest.model_validate(
        {
            "model": "kimi",
            "messages": [
                {"role": "user", "content": "find x"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "functions.lookup:0",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": '{"q": "x"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "functions.lookup:0", "content": "found"},
            ],
        }
    )
    messages = chat_messages_as_dicts(req)
    assert messages[1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q": "x"}'}
    assert messages[2]["tool_call_id"] == "functions.lookup:0"


def test_a_completion_with_logprobs_and_tool_calls_parses_strictly_in_the_sdk() -> None:
    tokens = [Token("hi", b"hi", -0.5, (Token("hi", b"hi", -0.5), Token("yo", b"yo", -1.5)))]
    body = ChatCompletion(
        id="chatcmpl-1",
        created=0,
        model="glm",
        choices=[
            Choice(
                index=0,
                message=ChatCompletionMessage(
                    content=None,
                    tool_calls=[
                        ChatCompletionMessageToolCall.from_call(Call("c1", "lookup", "{}"))
                    ],
                ),
                logprobs=ChoiceLogprobs.from_tokens(tokens),
                finish_reason="tool_calls",
            )
        ],
        usage=Usage.from_counts(3, 1),
    ).model_dump(mode="json")
    sdk = SDKChatCompletion.model_validate(body)
    choice = sdk.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "lookup"
    assert choice.logprobs.content[0].logprob == -0.5
    assert [t.token for t in choice.logprobs.content[0].top_logprobs] == ["hi", "yo"]
    assert choice.logprobs.content[0].bytes == list(b"hi")


def test_a_chunk_with_a_tool_call_delta_parses_strictly_in_the_sdk() -> None:
    head, *fragments = ChoiceDeltaToolCall.deltas_of(0, Call("c1", "lookup", '{"q": 1}'))
    arguments = ""
    for piece in (head, *fragments):
        chunk = ChatCompletionChunk(
            id="chatcmpl-1",
            created=0,
            model="glm",
            choices=[
                ChunkChoice(
                    index=1,
                    delta=ChoiceDelta(tool_calls=[piece]),
                    logprobs=ChoiceLogprobs.from_tokens([Token("a", b"a", -2.0)]),
                    finish_reason=None,
                )
            ],
        ).model_dump(mode="json")
        sdk = SDKChatCompletionChunk.model_validate(chunk)
        call = sdk.choices[0].delta.tool_calls[0]
        assert call.index == 0 and sdk.choices[0].logprobs.content[0].token == "a"
        arguments += call.function.arguments
        if piece is head:
            assert (call.id, call.type, call.function.name, arguments) == (
                "c1",
                "function",
                "lookup",
                "",
            )
    assert arguments == '{"q": 1}'
