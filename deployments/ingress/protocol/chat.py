"""`POST /v1/chat/completions`: the request we accept (text content; sampling, logprobs, n, tools
and response formats). The bodies we return are in `chat_response`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

# The messages and tools live in `chat_messages`; every name stays importable from here.
from deployments.ingress.protocol.chat_messages import (
    TEMPLATE_ROLES,
    TEXT_PART_SEPARATOR,  # noqa: F401
    TOOL_NAME_PATTERN,  # noqa: F401
    ChatMessage,
    ChatTool,
    ChatToolCallParam,  # noqa: F401
    FunctionCallParam,  # noqa: F401
    FunctionDefinition,  # noqa: F401
    JSONSchemaFormat,  # noqa: F401
    MessageContent,  # noqa: F401
    NamedFunction,  # noqa: F401
    NamedToolChoice,
    ResponseFormat,
    Role,  # noqa: F401
    TextContentPart,  # noqa: F401
)
from deployments.ingress.protocol.common import (
    LenientModel,
    OpenAIRequest,
    RequestOptions,
    ensure_utf8,
    reject_unsupported,
)

MAX_STOP_SEQUENCES = 4
MAX_CHOICES = 8  # the engine's own limit (LLMRuntime.max_choices) may be lower
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0
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


class StreamOptions(LenientModel):
    include_usage: bool = False


def check_logit_bias(value: Any) -> Any:
    """`{"token id": bias}` with ids as decimal strings and biases in [-100, 100]."""
    if value is None:
        return value
    if not isinstance(value, dict):
        raise PydanticCustomError("dict_type", "must be an object of token id -> bias")
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit()):
            raise PydanticCustomError(
                "logit_bias_key",
                "keys must be token ids (decimal strings), got {key!r}",
                {"key": key},
            )
        if (
            isinstance(bias, bool)
            or not isinstance(bias, int | float)
            or abs(bias) > MAX_LOGIT_BIAS
        ):
            raise PydanticCustomError(
                "logit_bias_value",
                "bias for token {key} must be a number between -100 and 100",
                {"key": key},
            )
    return {k: float(v) for k, v in value.items()}


class ChatCompletionRequest(OpenAIRequest):
    """A chat completion request, fields in the order of OpenAI's reference, then our
    extensions. OpenAI parameters we cannot honour are a 400 (`unsupported_parameter`); `user`,
    `metadata`, `store`, `service_tier`, `prompt_cache_key` and `safety_identifier` are accepted
    and ignored on purpose; fields OpenAI does not define are accepted and reported as ignored."""

    messages: list[ChatMessage] = Field(min_length=1)
    model: str = Field(min_length=1)
    audio: Any = Field(default=None, exclude=True)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    function_call: Any = Field(default=None, exclude=True)
    functions: Any = Field(default=None, exclude=True)
    logit_bias: dict[str, float] | None = None
    logprobs: bool = False
    max_completion_tokens: int | None = Field(default=None, ge=1)
    max_tokens: int | None = Field(
        default=None, ge=1, description="Deprecated by OpenAI for max_completion_tokens."
    )
    metadata: Any = Field(default=None, exclude=True)
    modalities: list[Literal["text"]] | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES, description="Choices decoded as one batch.")
    parallel_tool_calls: bool = True
    prediction: Any = Field(default=None, exclude=True)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    prompt_cache_key: Any = Field(default=None, exclude=True)
    reasoning_effort: Any = Field(default=None, exclude=True)
    response_format: ResponseFormat | None = None
    safety_identifier: Any = Field(default=None, exclude=True)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    service_tier: Any = Field(default=None, exclude=True)
    stop: StopSequences | None = Field(
        default=None, description=f"Up to {MAX_STOP_SEQUENCES} sequences where generation stops."
    )
    store: Any = Field(default=None, exclude=True)
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    # tools before tool_choice (OpenAI lists them the other way): the choice is checked against them
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    user: Any = Field(default=None, exclude=True)
    verbosity: Any = Field(default=None, exclude=True)
    web_search_options: Any = Field(default=None, exclude=True)
    # Extensions (vLLM's and Workers AI's names)
    raw: bool = Field(
        default=False,
        description="Extension (Workers AI): the one user message is the whole prompt, sent "
        "without the chat template; special-token strings in it stay text.",
    )
    top_k: int = Field(default=0, ge=0, description="Extension: 0 keeps every token.")
    repetition_penalty: float = Field(
        default=1.0, gt=0.0, le=2.0, description="Extension: 1 is off."
    )
    options: RequestOptions | None = Field(
        default=None,
        description="Extension (Workers AI's, on its OpenAI-compatible chat completions): "
        '`{"rejectIfBusy": true}` answers a 429 at once instead of waiting for capacity.',
    )
    prompt_logprobs: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TOP_LOGPROBS,
        description="Extension (vLLM's): the prompt's own tokens' logprobs, with this many "
        "alternatives each, in the answer's `prompt_logprobs`.",
    )

    _check_unsupported = field_validator(
        "audio",
        "function_call",
        "functions",
        "prediction",
        "reasoning_effort",
        "verbosity",
        "web_search_options",
    )(reject_unsupported)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _check_logit_bias(cls, value: Any) -> Any:
        return check_logit_bias(value)

    @field_validator("raw")
    @classmethod
    def _raw_is_one_prompt(cls, value: bool, info: ValidationInfo) -> bool:
        messages = info.data.get("messages") or []
        if value and (len(messages) != 1 or messages[0].role != "user"):
            raise PydanticCustomError(
                "raw_prompt", "raw takes exactly one user message (the prompt)"
            )
        return value

    @field_validator("top_logprobs")
    @classmethod
    def _only_with_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and info.data.get("logprobs") is False:
            raise PydanticCustomError(
                "top_logprobs_without_logprobs", "requires logprobs to be true"
            )
        return value

    @field_validator("tool_choice")
    @classmethod
    def _choice_among_tools(cls, value: Any, info: ValidationInfo) -> Any:
        if "tools" not in info.data:  # the tools failed their own checks
            return value
        tools = info.data["tools"] or []
        if value not in (None, "none") and not tools:
            raise PydanticCustomError("tool_choice_without_tools", "is only allowed with tools")
        names = [tool.function.name for tool in tools]
        if isinstance(value, NamedToolChoice) and value.function.name not in names:
            raise PydanticCustomError(
                "unknown_tool",
                "names {name!r}, which is not among the tools",
                {"name": value.function.name},
            )
        return value

    @property
    def tool_choice_name(self) -> str:
        """`none`, `auto`, `required` or the name of the one function to call."""
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return self.tool_choice or ("auto" if self.tools else "none")

    @property
    def tool_dicts(self) -> tuple[dict[str, Any], ...]:
        return tuple(tool.model_dump(exclude_none=True) for tool in self.tools or [])

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


def chat_messages_as_dicts(request: ChatCompletionRequest) -> list[dict[str, Any]]:
    """The conversation as a chat template takes it: one string of content per message, and an
    assistant's past tool calls and a tool result's call id."""
    out: list[dict[str, Any]] = []
    for message in request.messages:
        item: dict[str, Any] = {
            "role": TEMPLATE_ROLES.get(message.role, message.role),
            "content": message.text,
        }
        if message.tool_calls:
            item["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        if message.tool_call_id is not None:
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out
