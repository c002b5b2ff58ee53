"""`POST /v1/chat/completions`: the request we accept (text only, one choice) and the completion
and stream-chunk bodies we return, shaped so the official `openai` SDK parses them."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import (
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from deployments.protocol.common import (
    EMPTY_INPUT,
    UNSUPPORTED_CONTENT,
    UNSUPPORTED_VALUE,
    LenientModel,
    OpenAIRequest,
    ResponseModel,
    Usage,
    Utf8Str,
    ensure_utf8,
)

MAX_STOP_SEQUENCES = 4
# How the text parts of one message become one string; vLLM joins them the same way.
TEXT_PART_SEPARATOR = "\n"
# Chat templates know system/user/assistant/tool; OpenAI's newer `developer` role plays `system`.
TEMPLATE_ROLES: Mapping[str, str] = MappingProxyType({"developer": "system"})

Role = Literal["system", "developer", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "content_filter"]


# The schema states the limits; `check_stop_sequences` enforces them first, with one clear error.
StopSequences = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOP_SEQUENCES)]
)


def check_stop_sequences(value: Any) -> Any:
    """Validate `stop` (a string or up to four non-empty strings) in one place, so a bad value gets
    one error rather than one per branch of the union. Returns `value` unchanged."""
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list):
        raise PydanticCustomError("string_type", "must be a string or a list of strings")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise PydanticCustomError(
            "too_long",
            "takes at most {limit} sequences, got {count}",
            {"limit": MAX_STOP_SEQUENCES, "count": len(stops)},
        )
    for index, stop in enumerate(stops):
        if not isinstance(stop, str) or not stop:
            raise PydanticCustomError(
                "string_type", "sequence {index} must be a non-empty string", {"index": index}
            )
        ensure_utf8(stop)
    return value


class TextContentPart(LenientModel):
    text: Utf8Str
    type: Literal["text"]


def _content_kind(value: Any) -> str:
    return "str" if isinstance(value, str) else "list"


# Tagged by Python type so a bad text part is reported once, by the list branch only; the tags
# ("str", "list") are dropped from error paths by `protocol.errors`.
MessageContent = Annotated[
    Annotated[str, Tag("str")] | Annotated[list[TextContentPart], Tag("list")],
    Discriminator(_content_kind),
]


class ChatMessage(LenientModel):
    content: MessageContent | None = None
    role: Role
    name: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _only_text(cls, value: Any) -> Any:
        if value is None:
            return value
        if isinstance(value, str):
            return ensure_utf8(value)
        if not isinstance(value, list):
            raise PydanticCustomError("string_type", "must be a string or a list of text parts")
        if not value:
            raise PydanticCustomError(EMPTY_INPUT, "must not be an empty list")
        for index, part in enumerate(value):
            # A part without `type` is left to the model, which reports the missing field.
            part_type = part.get("type", "text") if isinstance(part, dict) else "text"
            if part_type != "text":
                raise PydanticCustomError(
                    UNSUPPORTED_CONTENT,
                    "only text content is supported; part {index} has type '{part_type}'",
                    {"index": index, "part_type": str(part_type)},
                )
        return value

    @model_validator(mode="after")
    def _content_unless_assistant(self) -> ChatMessage:
        # OpenAI lets only an assistant message (one that made tool calls) omit its content.
        if self.content is None and self.role != "assistant":
            raise PydanticCustomError(
                "missing", "content is required for role '{role}'", {"role": self.role}
            )
        return self

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return TEXT_PART_SEPARATOR.join(part.text for part in self.content)


class StreamOptions(LenientModel):
    include_usage: bool = False


class ChatCompletionRequest(OpenAIRequest):
    """A chat completion request, fields in the order of OpenAI's reference. Text content only
    and one choice (`n` = 1); other OpenAI fields are accepted and ignored."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: str = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(
        default=None, ge=1, description="Deprecated by OpenAI for max_completion_tokens."
    )
    n: int = Field(
        default=1,
        description="How many choices to generate; only 1 is supported.",
        json_schema_extra={"minimum": 1, "maximum": 1},
    )
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: StopSequences | None = Field(
        default=None, description=f"Up to {MAX_STOP_SEQUENCES} sequences where generation stops."
    )
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int) -> int:
        if value != 1:
            raise PydanticCustomError(
                UNSUPPORTED_VALUE, "only n=1 is supported, got {n}", {"n": value}
            )
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _check_stop(cls, value: Any) -> Any:
        return check_stop_sequences(value)

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions, info: ValidationInfo) -> StreamOptions:
        if info.data.get("stream") is False:
            raise PydanticCustomError(
                "stream_options_without_stream", "is only allowed when stream is true"
            )
        return value

    @property
    def effective_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @property
    def include_usage(self) -> bool:
        """Whether a stream ends with a usage chunk."""
        return self.stream_options is not None and self.stream_options.include_usage


def chat_messages_as_dicts(request: ChatCompletionRequest) -> list[dict[str, str]]:
    """The conversation as a chat template takes it: one string of content per message."""
    return [
        {"role": TEMPLATE_ROLES.get(message.role, message.role), "content": message.text}
        for message in request.messages
    ]


class ChatCompletionMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None


class Choice(ResponseModel):
    index: int
    message: ChatCompletionMessage
    logprobs: None = None
    finish_reason: FinishReason


class ChatCompletion(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    system_fingerprint: str | None = None


class ChoiceDelta(ResponseModel):
    """The role comes in the first chunk, text in the middle ones, neither in the last."""

    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(ResponseModel):
    index: int
    delta: ChoiceDelta
    logprobs: None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(ResponseModel):
    """One `data:` event of a stream. With `include_usage`, OpenAI's last chunk has no choices
    and carries the usage; every other chunk has `usage: null`."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChunkChoice]
    usage: Usage | None = None
