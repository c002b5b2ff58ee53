"""`POST /v1/completions` (OpenAI's legacy completions): a raw prompt, no chat template, and the
`text_completion` bodies (whole and streamed) with the legacy logprobs layout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field, field_validator

from deployments.ingress.protocol.chat import (
    MAX_CHOICES,
    ChatCompletionRequest,
    ChatMessage,
    StopSequences,
    StreamOptions,
    check_logit_bias,
    check_stop_sequences,
)
from deployments.ingress.protocol.common import (
    OpenAIRequest,
    ResponseModel,
    Usage,
    as_text_list,
    check_text_inputs,
    make_id,
    reject_unsupported,
)

COMPLETION_ID_PREFIX = "cmpl"
MAX_LEGACY_LOGPROBS = 5  # OpenAI's own limit for this endpoint
LEGACY_DEFAULT_MAX_TOKENS = 16  # OpenAI's default here
# Prompts in one request (LangChain's `OpenAI` LLM sends up to its batch_size, 20 by default);
# each is admitted and rate-limited as a request of its own.
MAX_PROMPTS = 20


class CompletionRequest(OpenAIRequest):
    """Fields in the order of OpenAI's reference. A prompt, or a list of up to MAX_PROMPTS (each
    answered by `n` choices, indexed as OpenAI does: prompt * n + choice); token arrays are
    refused like embeddings'; `suffix` (insertion) and `best_of` > 1 are 400s."""

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
    def _text_prompts(cls, value: Any) -> Any:
        return check_text_inputs(value, max_items=MAX_PROMPTS)

    @field_validator("stop", mode="before")
    @classmethod
    def _check_stop(cls, value: Any) -> Any:
        return check_stop_sequences(value)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _check_logit_bias(cls, value: Any) -> Any:
        return check_logit_bias(value)

    @property
    def prompts(self) -> list[str]:
        return as_text_list(self.prompt)

    def as_chat(self, prompt: str) -> ChatCompletionRequest:
        """The generation of one of the prompts as a raw chat request (one path serves both
        endpoints); with `echo` and `logprobs`, the prompt's own logprobs too."""
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
            messages=[ChatMessage(role="user", content=prompt)],
            raw=True,
            logprobs=self.logprobs is not None,
            top_logprobs=self.logprobs,
            prompt_logprobs=self.logprobs if self.echo else None,
            **fields,
        )


class CompletionLogprobs(ResponseModel):
    """The legacy layout. An echoed prompt's first token has null for its logprob and its top
    logprobs, as OpenAI's answers have: nothing precedes it."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]

    @classmethod
    def from_tokens(cls, tokens: Sequence[Any], start: int = 0) -> CompletionLogprobs:
        """From token records (`token`, `logprob`, `top_logprobs`: the engine's, or a chat
        answer's); offsets count from `start` (after an echoed prompt)."""
        offsets, at = [], start
        for t in tokens:
            offsets.append(at)
            at += len(t.token)
        return cls(
            tokens=[t.token for t in tokens],
            token_logprobs=[t.logprob for t in tokens],
            top_logprobs=[
                None if t.logprob is None else {a.token: a.logprob for a in t.top_logprobs}
                for t in tokens
            ],
            text_offset=offsets,
        )

    def followed_by(self, more: CompletionLogprobs) -> CompletionLogprobs:
        return CompletionLogprobs(
            tokens=self.tokens + more.tokens,
            token_logprobs=self.token_logprobs + more.token_logprobs,
            top_logprobs=self.top_logprobs + more.top_logprobs,
            text_offset=self.text_offset + more.text_offset,
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
