"""`POST /v1/chat/completions`: the completion and stream-chunk bodies we return, shaped so the
official `openai` SDK parses them (`chat.completions.parse` included)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from deployments.ingress.protocol.common import ResponseModel, Usage

FinishReason = Literal["stop", "length", "content_filter", "tool_calls"]
# A streamed call's arguments come in pieces of this size, about a token's worth each as OpenAI
# streams them (our engine parses a call whole, at the end of its choice).
ARGUMENT_FRAGMENT_CHARS = 8


class TopLogprob(ResponseModel):
    token: str
    bytes: list[int] | None
    logprob: float


def _token_fields(t: Any) -> dict[str, Any]:
    """An engine token record (`token`, `token_bytes`, `logprob`, `top_logprobs`) as the fields
    OpenAI's token logprobs have."""
    return {
        "token": t.token,
        "bytes": list(t.token_bytes),
        "logprob": t.logprob,
        "top_logprobs": [
            TopLogprob(token=a.token, bytes=list(a.token_bytes), logprob=a.logprob)
            for a in t.top_logprobs
        ],
    }


class ChatCompletionTokenLogprob(ResponseModel):
    token: str
    bytes: list[int] | None
    logprob: float
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(ResponseModel):
    content: list[ChatCompletionTokenLogprob] | None
    refusal: None = None

    @classmethod
    def from_tokens(cls, tokens: Sequence[Any]) -> ChoiceLogprobs:
        """From the engine's token records (`token`, `token_bytes`, `logprob`, `top_logprobs`)."""
        return cls(content=[ChatCompletionTokenLogprob(**_token_fields(t)) for t in tokens])


class PromptTokenLogprob(ResponseModel):
    """Extension (vLLM's `prompt_logprobs`): a prompt token and its logprob given the tokens
    before it; null for the first, which nothing precedes."""

    token: str
    bytes: list[int] | None
    logprob: float | None
    top_logprobs: list[TopLogprob]

    @classmethod
    def from_tokens(cls, tokens: Sequence[Any]) -> list[PromptTokenLogprob]:
        """From the engine's prompt token records (the first one's `logprob` None)."""
        return [cls(**_token_fields(t)) for t in tokens]


class FunctionCall(ResponseModel):
    name: str
    arguments: str


class ChatCompletionMessageToolCall(ResponseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall

    @classmethod
    def from_call(cls, call: Any) -> ChatCompletionMessageToolCall:
        """From the engine's tool call (`id`, `name`, `arguments`)."""
        return cls(id=call.id, function=FunctionCall(name=call.name, arguments=call.arguments))


class ChatCompletionMessage(ResponseModel):
    """`refusal` is required and nullable in OpenAI's schema: our models never refuse."""

    omitted_when_none = frozenset({"tool_calls"})

    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: None = None
    tool_calls: list[ChatCompletionMessageToolCall] | None = None


class Choice(ResponseModel):
    index: int
    message: ChatCompletionMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason


class ChatCompletion(ResponseModel):
    omitted_when_none = frozenset({"prompt_logprobs"})

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    prompt_logprobs: list[PromptTokenLogprob] | None = None  # only when asked (extension)


class ChoiceDelta(ResponseModel):
    """The role comes in the first chunk, text in the middle ones, neither in the last; what a
    delta does not carry is absent, never null."""

    omitted_when_none = frozenset({"role", "content", "tool_calls"})

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ChoiceDeltaToolCall] | None = None


class ChoiceDeltaToolCallFunction(ResponseModel):
    omitted_when_none = frozenset({"name", "arguments"})

    name: str | None = None
    arguments: str | None = None


class ChoiceDeltaToolCall(ResponseModel):
    """A piece of one call in a stream, as OpenAI sends it: the first names the call (index, id,
    type, function name, empty arguments), the rest carry its index and argument fragments."""

    omitted_when_none = frozenset({"id", "type", "function"})

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: ChoiceDeltaToolCallFunction | None = None

    @classmethod
    def deltas_of(cls, index: int, call: Any) -> list[ChoiceDeltaToolCall]:
        """The deltas of the engine's whole call (`id`, `name`, `arguments`), call `index` of
        its choice."""
        head = cls(
            index=index,
            id=call.id,
            type="function",
            function=ChoiceDeltaToolCallFunction(name=call.name, arguments=""),
        )
        text, size = call.arguments, ARGUMENT_FRAGMENT_CHARS
        fragments = [
            cls(index=index, function=ChoiceDeltaToolCallFunction(arguments=text[at : at + size]))
            for at in range(0, len(text), size)
        ]
        return [head, *fragments]


class ChunkChoice(ResponseModel):
    index: int
    delta: ChoiceDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(ResponseModel):
    """One `data:` event of a stream. With `include_usage`, OpenAI's last chunk has no choices
    and carries the usage; no other chunk has a `usage` field."""

    omitted_when_none = frozenset({"usage"})

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
