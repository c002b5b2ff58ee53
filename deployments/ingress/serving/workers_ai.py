"""Workers AI's `/ai/run/{model}` as a service: an input checked against its model's task (a
chat alias takes OpenAI's chat request) and run to the `result` the envelope carries. One path
for a client's request and a batch item's (deployments.ingress.serving.batch)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from deployments.ingress.protocol import (
    WORKERS_INPUT_BY_TASK,
    ChatCompletionRequest,
    OpenAIRequest,
    Usage,
    WorkersChatResult,
    rejects_if_busy,
    request_error_from_validation,
    workers_chat_to_chat_request,
    workers_embedding_result,
)
from deployments.ingress.protocol.workers_ai import (
    WorkersModerationVerdict,
    WorkersOpenAIChatInput,
    WorkersToolCall,
    unknown_fields_error,
)
from deployments.ingress.serving.chat import ChatService
from deployments.ingress.serving.context import RequestContext
from deployments.ingress.serving.models import ModelCatalogue, ServedModel
from deployments.ingress.serving.texts import EmbeddingService, ModerationService


@dataclass(frozen=True)
class WorkersInput:
    """A checked input: the model it is for, and, for a chat model called by one of its
    catalogue aliases, OpenAI's chat request (`alias`), else its task's Workers AI input."""

    model: ServedModel
    name: str  # as the client called it
    input: Any
    alias: bool = False

    @property
    def stream(self) -> bool:
        return bool(getattr(self.input, "stream", False))

    @property
    def rejects_if_busy(self) -> bool:
        return rejects_if_busy(self.input)

    def chat(self) -> ChatCompletionRequest:
        if self.alias:
            chat: ChatCompletionRequest = self.input.as_chat(self.name)
            return chat
        return workers_chat_to_chat_request(self.model.name, self.input)


@dataclass(frozen=True)
class WorkersAnswer:
    result: Any  # the envelope's `result`
    headers: dict[str, str]
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class WorkersRun:
    catalogue: ModelCatalogue
    chat: ChatService
    embeddings: EmbeddingService
    moderations: ModerationService

    def parse(self, model_name: str, body: dict[str, Any]) -> WorkersInput:
        """`body` checked as `model_name`'s input: 404 for no such model, 400 for a bad input
        (Workers AI refuses a field its schema does not define)."""
        model = self.catalogue.get(model_name)
        if model.task == "chat" and model_name != model.name:
            return WorkersInput(model, model_name, _validated(WorkersOpenAIChatInput, body), True)
        return WorkersInput(
            model, model_name, _validated(WORKERS_INPUT_BY_TASK[model.task], body, model.task)
        )

    async def run(self, given: WorkersInput, ctx: RequestContext) -> WorkersAnswer:
        """A whole (unstreamed) answer; the caller streams a `stream` input itself."""
        model = given.model
        if model.task == "chat":
            answer = await self.chat.complete(given.chat(), ctx, use_cache=False)
            completion = answer.value
            usage = completion.usage
            tokens = (usage.prompt_tokens, usage.completion_tokens)
            if given.alias:
                return WorkersAnswer(completion, answer.headers, *tokens)
            message = completion.choices[0].message
            calls = [WorkersToolCall.from_openai(c) for c in message.tool_calls or []]
            result = WorkersChatResult(
                response=message.content or "",
                usage=Usage.from_counts(*tokens),  # the classic record's three counts
                tool_calls=calls or None,
            )
            return WorkersAnswer(result, answer.headers, *tokens)
        if model.task == "embedding":
            vectors = await self.embeddings.embed(model.name, given.input.texts, ctx)
            return WorkersAnswer(
                workers_embedding_result(vectors.value.vectors),
                vectors.headers,
                vectors.value.prompt_tokens,
            )
        verdicts = await self.moderations.classify(model.name, given.input.texts, ctx)
        return WorkersAnswer(
            [WorkersModerationVerdict.of(verdict) for verdict in verdicts.value.results],
            verdicts.headers,
        )


def _validated(kind: type[OpenAIRequest], body: dict[str, Any], task: str = "chat") -> Any:
    """`body` as a `kind`; Workers AI refuses a field its schema does not define (a 400)."""
    try:
        task_input = kind.model_validate(body)
    except ValidationError as exc:
        raise request_error_from_validation(exc.errors()) from None
    unknown = unknown_fields_error(task_input, task)
    if unknown is not None:
        raise unknown
    return task_input
