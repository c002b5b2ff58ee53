"""`POST /v1/completions` (OpenAI's legacy completions): a raw prompt, no chat template, and the
`text_completion` bodies (whole and streamed) with the legacy logprobs layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator

from deployments.protocol.chat import (
    MAX_CHOICES,
    ChatCompletionRequest,
    ChatMessage,
    StopSequences,
    StreamOptions,
    check_logit_bias,
    check_stop_sequences,
)
from deployments.protocol.common import (
    OpenAIRequest,
    ResponseModel,
    Usage,
    check_text_inputs,
    make_id,
    reject_unsupported,
)

COMPLETION_ID_PREFIX = "cmpl"
MAX_LEGACY_LOGPROBS = 5  # OpenAI's own limit for this endpoint
LEGACY_DEFAULT_MAX_TOKENS = 16  # OpenAI's default here


class CompletionRequest(OpenAIRequest):
    """Fields in the order of OpenAI's reference. One prompt (a string, or a list of one string;
    token arrays are refused like embeddings'); `suffix` (insertion) and `best_of` > 1 are 400s."""

    model: str = Field(min_length=1)
    prompt: str | list[str]
    best_of: int | None = Field(default=None, ge=1, le=1, description="Only 1 is supported.")
    echo: bool = False
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LEGACY_LOGPROBS)
    max_tokens: int = Field(default=LEGACY_DEFAULT_MAX_TOKENS, ge=1)
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stop: StopSequences | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    suffix: Any = Field(default=None, exclude=True)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    user: Any = Field(default=None, exclude=True)

    _check_suffix = field_validator("suffix")(reject_unsupported)

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_text_prompt(cls, value: Any) -> Any:
        return check_text_inputs(value, max_items=1)

    @field_validator("stop", mode="before")
    @classmethod
    def _check_stop(cls, value: Any) -> Any:
        return check_stop_sequences(value)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _check_logit_bias(cls, value: Any) -> Any:
        return check_logit_bias(value)

    @property
    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def as_chat(self) -> ChatCompletionRequest:
        """The same generation as a raw chat request (one path serves both endpoints)."""
        fields = self.model_dump(
            include={
                "frequency_penalty",
                "logit_bias",
                "max_tokens",
                "n",
                "presence_penalty",
                "seed",
                "stop",
                "stream",
                "stream_options",
                "temperature",
                "top_p",
            },
            exclude_none=True,
        )
        return ChatCompletionRequest(
            model=self.model,
            messages=[ChatMessage(role="user", content=self.prompt_text)],
            raw=True,
            logprobs=self.logprobs is not None,
            top_logprobs=self.logprobs,
            **fields,
        )


class CompletionLogprobs(ResponseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]

    @classmethod
    def from_tokens(cls, tokens: Sequence[Any], start: int = 0) -> CompletionLogprobs:
        """From the engine's token records; offsets count from `start` (the echoed prompt)."""
        offsets, at = [], start
        for t in tokens:
            offsets.append(at)
            at += len(t.token)
        return cls(
            tokens=[t.token for t in tokens],
            token_logprobs=[t.logprob for t in tokens],
            top_logprobs=[{a.token: a.logprob for a in t.top_logprobs} for t in tokens],
            text_offset=offsets,
        )


class CompletionChoice(ResponseModel):
    text: str
    index: int
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length", "content_filter"] | None


class Completion(ResponseModel):
    """A whole answer, or (streamed) one `data:` event, as OpenAI sends both; an event has a
    `usage` only when it is the usage event."""

    omitted_when_none = frozenset({"usage"})

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


def completion_id() -> str:
    return make_id(COMPLETION_ID_PREFIX)
