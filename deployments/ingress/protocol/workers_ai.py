"""`POST /ai/run/{model}`, the Workers-AI-style API: one input type per task, results wrapped in
Cloudflare's `{result, success, errors, messages}` envelope, and chat inputs mapped onto the
OpenAI chat request so one code path serves both APIs."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from deployments.errors import InvalidRequestError, ServingError, envelope_code
from deployments.ingress.protocol.chat import (
    ChatCompletionRequest,
    ChatMessage,
    ResponseFormat,
    StopSequences,
    check_stop_sequences,
)
from deployments.ingress.protocol.common import (
    LenientModel,
    OpenAIRequest,
    RequestOptions,
    ResponseModel,
    Usage,
    Utf8Str,
    as_text_list,
    check_text_inputs,
    json_ready,
)
from deployments.ingress.protocol.embeddings import MAX_EMBEDDING_INPUTS
from deployments.ingress.protocol.models import Task
from deployments.ingress.protocol.moderations import MAX_MODERATION_INPUTS, Moderation

# The fields a Workers chat input shares, by name and meaning, with the OpenAI chat request.
SHARED_CHAT_FIELDS = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stream",
        "stop",
        "raw",
        "repetition_penalty",
        "frequency_penalty",
        "presence_penalty",
    }
)


def unknown_fields_error(task_input: OpenAIRequest, task: str) -> InvalidRequestError | None:
    """Workers AI refuses what its schemas do not define: the 400 naming the first such field."""
    ignored = task_input.ignored_fields()
    if not ignored:
        return None
    known = ", ".join(sorted(type(task_input).model_fields))
    return InvalidRequestError(
        f"unknown field {ignored[0]!r} for a {task} model (it takes: {known})", param=ignored[0]
    )


class WorkersResponseFormat(LenientModel):
    """Workers AI's JSON mode: `json_schema` is the schema itself (not OpenAI's wrapper)."""

    type: Literal["json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None

    def as_openai(self) -> ResponseFormat:
        if self.type == "json_object" or self.json_schema is None:
            return ResponseFormat(type="json_object")
        return ResponseFormat.model_validate(
            {
                "type": "json_schema",
                "json_schema": {"name": "workers_ai", "schema": self.json_schema},
            }
        )


class WorkersChatInput(OpenAIRequest):
    """Workers AI text generation: either a bare `prompt` (one user turn, or with `raw` the
    whole prompt, no chat template) or a `messages` conversation, never both. Sampling fields
    take OpenAI's ranges (the same engine serves both APIs); an unknown field is a 400."""

    prompt: Utf8Str | None = Field(default=None, min_length=1)
    messages: list[ChatMessage] | None = Field(default=None, min_length=1, validate_default=True)
    raw: bool = False
    stream: bool = False
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    response_format: WorkersResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    stop: StopSequences | None = None
    options: RequestOptions | None = None

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


class WorkersOpenAIChatInput(ChatCompletionRequest):
    """What a chat alias takes on the Workers AI paths, as its catalogue record defines it
    (`@cf/zai-org/glm-4.7-flash`, `@cf/moonshotai/kimi-k2.6`): OpenAI's chat request, with a
    bare `prompt` (one user turn) in place of `messages` allowed; the model is the path's."""

    model: str | None = None  # type: ignore[assignment]  # the path names the model
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)  # type: ignore[assignment]
    prompt: Utf8Str | None = Field(default=None, min_length=1)

    @field_validator("raw")
    @classmethod
    def _raw_is_one_prompt(cls, value: bool, info: ValidationInfo) -> bool:
        return value  # checked on the chat request `as_chat` builds, once the prompt is a message

    @model_validator(mode="after")
    def _exactly_one_of_prompt_and_messages(self) -> WorkersOpenAIChatInput:
        if (self.prompt is None) == (self.messages is None):
            raise PydanticCustomError(
                "prompt_or_messages", "give exactly one of prompt or messages"
            )
        return self

    def as_chat(self, model: str) -> ChatCompletionRequest:
        """The OpenAI chat request this input is, for `model`."""
        messages = self.messages or [ChatMessage(role="user", content=self.prompt)]
        fields = self.model_dump(
            exclude={"prompt", "model", "messages", "options"}, exclude_unset=True
        )
        return ChatCompletionRequest.model_validate(
            {**fields, "model": model, "messages": messages}
        )


class WorkersEmbeddingInput(OpenAIRequest):
    text: str | list[str]
    options: RequestOptions | None = None

    @field_validator("text", mode="before")
    @classmethod
    def _check_text(cls, value: Any) -> Any:
        return check_text_inputs(value, max_items=MAX_EMBEDDING_INPUTS)

    @property
    def texts(self) -> list[str]:
        return as_text_list(self.text)


class WorkersModerationInput(OpenAIRequest):
    text: str | list[str]
    options: RequestOptions | None = None

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
    extra: dict[str, Any] = {}
    if chat_input.response_format is not None:
        extra["response_format"] = chat_input.response_format.as_openai()
    if chat_input.tools:
        # Workers AI takes OpenAI's {type, function} tools and its own flat {name, parameters}.
        extra["tools"] = [
            tool if "function" in tool else {"type": "function", "function": tool}
            for tool in chat_input.tools
        ]
    return ChatCompletionRequest.model_validate(
        {"model": model, "messages": messages, **shared, **extra}
    )


class WorkersToolCall(ResponseModel):
    name: str
    arguments: Any  # Workers AI gives the arguments as an object (the text if it is not JSON)

    @classmethod
    def from_openai(cls, call: Any) -> WorkersToolCall:
        try:
            arguments = json.loads(call.function.arguments)
        except json.JSONDecodeError:
            arguments = call.function.arguments
        return cls(name=call.function.name, arguments=arguments)


class WorkersChatResult(ResponseModel):
    """The classic text-generation answer, or, streamed, one `data:` event per piece of text.
    `response` is a string (empty when the answer is only tool calls); what is not there is
    absent, never null."""

    omitted_when_none = frozenset({"usage", "tool_calls"})

    response: str
    usage: Usage | None = None
    tool_calls: list[WorkersToolCall] | None = None


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
    code: int = Field(ge=1000)
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


def error_envelope(error: ServingError) -> dict[str, Any]:
    """The JSON body of a failure: the error's envelope code (Cloudflare's where it has one)."""
    code = envelope_code(type(error))
    return WorkersEnvelope(
        success=False, errors=[WorkersError(code=code, message=error.message)]
    ).model_dump(mode="json")


class WorkersTask(ResponseModel):
    id: str
    name: str
    description: str


# Workers AI's task records, as its catalogue gives them (ids and descriptions included), so a
# client filtering or grouping by task sees ours as Cloudflare's.
WORKERS_TASKS: Mapping[Task, WorkersTask] = MappingProxyType(
    {
        "chat": WorkersTask(
            id="c329a1f9-323d-4e91-b2aa-582dd4188d34",
            name="Text Generation",
            description="Family of generative text models, such as large language models (LLM), "
            "that can be adapted for a variety of natural language tasks.",
        ),
        "embedding": WorkersTask(
            id="0137cdcf-162a-4108-94f2-1ca59e8c65ee",
            name="Text Embeddings",
            description="Feature extraction models transform raw data into numerical features "
            "that can be processed while preserving the information in the original dataset. "
            "These models are ideal as part of building vector search applications or Retrieval "
            "Augmented Generation workflows with Large Language Models (LLM).",
        ),
        "moderation": WorkersTask(
            id="19606750-23ed-4371-aab2-c20349b53a60",
            name="Text Classification",
            description="Sentiment analysis or text classification is a common NLP task that "
            "classifies a text input into labels or classes.",
        ),
    }
)
MAX_MODELS_PER_PAGE = 1000
# Far past any catalogue's end, and inside the 64-bit integers JSON encoders write.
MAX_PAGE = 1_000_000


class WorkersModelProperty(ResponseModel):
    property_id: str
    value: str


class WorkersModel(ResponseModel):
    """One entry of `GET .../ai/models/search` (the cloudflare SDK's `client.ai.models.list`)."""

    id: str
    source: int = 1
    name: str
    description: str
    task: WorkersTask
    tags: list[str] = Field(default_factory=list)
    properties: list[WorkersModelProperty] = Field(default_factory=list)

    @classmethod
    def of(
        cls, name: str, served_as: str, task: Task, family: str, description: str
    ) -> WorkersModel:
        """`name` as a client may call it (`served_as` is the deployment it reaches)."""
        workers_task = WORKERS_TASKS[task]
        return cls(
            id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"ray-edge-ai/{name}")),
            name=name,
            description=description or f"{family} ({workers_task.name})",
            task=workers_task,
            properties=[
                WorkersModelProperty(property_id="served_as", value=served_as),
                WorkersModelProperty(property_id="family", value=family),
            ],
        )


class WorkersResultInfo(ResponseModel):
    page: int
    per_page: int
    count: int
    total_count: int


def page_envelope(models: Sequence[WorkersModel], page: int, per_page: int) -> dict[str, Any]:
    """One page of a list in Cloudflare's v4 envelope; a page past the end is empty."""
    start = (page - 1) * per_page
    chosen = list(models[start : start + per_page])
    body = ok_envelope(chosen)
    body["result_info"] = WorkersResultInfo(
        page=page, per_page=per_page, count=len(chosen), total_count=len(models)
    ).model_dump()
    return body


class WorkersModerationVerdict(Moderation):
    """A moderation verdict over Workers AI: OpenAI's fields plus Workers AI's text
    classification pair (`label`, `score`), so the cloudflare SDK's `TextClassification`
    type is filled too."""

    label: Literal["FLAGGED", "SAFE"]
    score: float = Field(description="the highest category score")

    @classmethod
    def of(cls, verdict: Moderation) -> WorkersModerationVerdict:
        return cls(
            **verdict.model_dump(),
            label="FLAGGED" if verdict.flagged else "SAFE",
            score=max(verdict.category_scores.values(), default=0.0),
        )
