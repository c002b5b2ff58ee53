"""`POST /ai/run/{model}`, the Workers-AI-style API: one input type per task, results wrapped in
Cloudflare's `{result, success, errors, messages}` envelope, and chat inputs mapped onto the
OpenAI chat request so one code path serves both APIs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from pydantic import Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from deployments.protocol.chat import (
    ChatCompletionRequest,
    ChatMessage,
    StopSequences,
    check_stop_sequences,
)
from deployments.protocol.common import (
    OpenAIRequest,
    ResponseModel,
    Usage,
    Utf8Str,
    as_text_list,
    check_text_inputs,
    json_ready,
)
from deployments.protocol.embeddings import MAX_EMBEDDING_INPUTS
from deployments.protocol.models import Task
from deployments.protocol.moderations import MAX_MODERATION_INPUTS

# The fields a Workers chat input shares, by name and meaning, with the OpenAI chat request.
SHARED_CHAT_FIELDS = frozenset({"max_tokens", "temperature", "top_p", "seed", "stream", "stop"})


class WorkersChatInput(OpenAIRequest):
    """Workers AI text generation: either a bare `prompt` (one user turn) or a `messages`
    conversation, never both. Sampling fields take OpenAI's ranges (the same engine serves both
    APIs); unknown fields are accepted and ignored."""

    prompt: Utf8Str | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, validate_default=True)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    stream: bool = False
    stop: StopSequences | None = None

    @field_validator("messages")
    @classmethod
    def _exactly_one_of_prompt_and_messages(
        cls, value: list[ChatMessage] | None, info: ValidationInfo
    ) -> list[ChatMessage] | None:
        if "prompt" not in info.data:  # the prompt failed its own checks; that error suffices
            return value
        if (info.data["prompt"] is None) == (value is None):
            raise PydanticCustomError(
                "prompt_or_messages", "give exactly one of prompt or messages"
            )
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _check_stop(cls, value: Any) -> Any:
        return check_stop_sequences(value)


class WorkersEmbeddingInput(OpenAIRequest):
    text: str | list[str]

    @field_validator("text", mode="before")
    @classmethod
    def _check_text(cls, value: Any) -> Any:
        return check_text_inputs(value, max_items=MAX_EMBEDDING_INPUTS)

    @property
    def texts(self) -> list[str]:
        return as_text_list(self.text)


class WorkersModerationInput(OpenAIRequest):
    text: str | list[str]

    @field_validator("text", mode="before")
    @classmethod
    def _check_text(cls, value: Any) -> Any:
        return check_text_inputs(value, max_items=MAX_MODERATION_INPUTS)

    @property
    def texts(self) -> list[str]:
        return as_text_list(self.text)


WORKERS_INPUT_BY_TASK: Mapping[Task, type[OpenAIRequest]] = MappingProxyType(
    {
        "chat": WorkersChatInput,
        "embedding": WorkersEmbeddingInput,
        "moderation": WorkersModerationInput,
    }
)


def workers_chat_to_chat_request(model: str, chat_input: WorkersChatInput) -> ChatCompletionRequest:
    """The OpenAI request this Workers input means: a prompt becomes one user message, and only
    the fields the client set are carried over, so the chat request's defaults apply to the rest."""
    if chat_input.messages is not None:
        messages = chat_input.messages
    else:
        messages = [ChatMessage(role="user", content=chat_input.prompt)]
    shared = chat_input.model_dump(include=set(SHARED_CHAT_FIELDS), exclude_unset=True)
    return ChatCompletionRequest(model=model, messages=messages, **shared)


class WorkersChatResult(ResponseModel):
    """A whole answer, or, streamed, one `data:` event per piece of text."""

    response: str
    usage: Usage | None = None


class WorkersEmbeddingResult(ResponseModel):
    """The documented schema; bodies are built by `workers_embedding_result`."""

    shape: list[int]
    data: list[list[float]]


def workers_embedding_result(vectors: np.ndarray | Sequence[Sequence[float]]) -> dict[str, Any]:
    """A `WorkersEmbeddingResult` as JSON-ready data: the matrix stays float32 numpy, which the
    router's encoder writes without a Python float per element."""
    matrix = np.asarray(vectors, dtype=np.float32)
    if matrix.ndim != 2:
        raise ValueError(f"expected one vector per text, got an array of shape {matrix.shape}")
    return {"shape": list(matrix.shape), "data": matrix}


class WorkersError(ResponseModel):
    code: int
    message: str


class WorkersEnvelope(ResponseModel):
    result: Any = None
    success: bool
    errors: list[WorkersError] = Field(default_factory=list)
    messages: list[str] = Field(default_factory=list)


def ok_envelope(result: Any) -> dict[str, Any]:
    """The JSON body of a success; `result` may be a model, a list of models or plain data
    (numpy arrays included). Built as data: the envelope is ours, validating it is waste."""
    return {"result": json_ready(result), "success": True, "errors": [], "messages": []}


def error_envelope(status: int, message: str) -> dict[str, Any]:
    """The JSON body of a failure; Cloudflare puts an error code where we put the HTTP status."""
    return WorkersEnvelope(
        success=False, errors=[WorkersError(code=status, message=message)]
    ).model_dump(mode="json")
