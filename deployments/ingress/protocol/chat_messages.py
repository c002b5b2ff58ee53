"""The messages and tools of a `POST /v1/chat/completions` request: a message's text content
(parts joined), tool calls and tool results, the tools offered, the tool choice and the response
format. The request itself is in `chat`, which re-exports these names."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, field_validator, model_validator
from pydantic_core import PydanticCustomError

from deployments.ingress.protocol.common import (
    EMPTY_INPUT,
    UNSUPPORTED_CONTENT,
    LenientModel,
    Utf8Str,
    ensure_utf8,
)

TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"
# How the text parts of one message become one string; vLLM joins them the same way.
TEXT_PART_SEPARATOR = "\n"
# Chat templates know system/user/assistant/tool; OpenAI's newer `developer` role plays `system`.
TEMPLATE_ROLES: Mapping[str, str] = MappingProxyType({"developer": "system"})

Role = Literal["system", "developer", "user", "assistant", "tool"]


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


class FunctionCallParam(LenientModel):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    arguments: Utf8Str


class ChatToolCallParam(LenientModel):
    """A call the assistant made earlier in the conversation, sent back by the client."""

    id: Utf8Str
    type: Literal["function"] = "function"
    function: FunctionCallParam


class ChatMessage(LenientModel):
    content: MessageContent | None = None
    role: Role
    name: str | None = None
    tool_calls: list[ChatToolCallParam] | None = None  # assistant
    tool_call_id: Utf8Str | None = None  # tool

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


class FunctionDefinition(LenientModel):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: Utf8Str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ChatTool(LenientModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(LenientModel):
    name: str = Field(min_length=1)


class NamedToolChoice(LenientModel):
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaFormat(LenientModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(LenientModel):
    """OpenAI's `text`, `json_object` or `json_schema` (the latter with its `json_schema`)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise PydanticCustomError(
                "json_schema_mismatch",
                "json_schema is required with (and only with) type json_schema",
            )
        return self

    def as_dict(self) -> dict[str, Any]:
        """The plain form the engine takes."""
        out: dict[str, Any] = {"type": self.type}
        if self.json_schema is not None:
            out["json_schema"] = {"schema": self.json_schema.schema_ or {"type": "object"}}
        return out
