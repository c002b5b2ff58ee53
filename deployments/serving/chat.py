"""Chat for both APIs: admission, the moderation gate, the cache (deterministic requests), the
edge and the model's handle, and the settlement of the key's tokens however the request ends."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from deployments.edge import EdgeTrace
from deployments.observability import RequestTelemetry
from deployments.protocol import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageToolCall,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    Usage,
    chat_completion_id,
    chat_messages_as_dicts,
    created_timestamp,
)
from deployments.runtime.chat_features import ChatFeatures
from deployments.runtime.outputs import Completion, GenerationChunk
from deployments.runtime.sampling_params import SamplingParams
from deployments.security import ModerationGate, metered_stream
from deployments.servers.base import Reply
from deployments.serving.admission import chat_features
from deployments.serving.answer import Answer
from deployments.serving.base import ModelService
from deployments.serving.context import RequestContext
from deployments.serving.models import ServedModel

# An opened stream: its first reply (proof the colo answered) and the generator of the rest.
OpenedStream = tuple[Reply[GenerationChunk], Any]
T = TypeVar("T")


def _is_reply(result: Any) -> Reply[Any]:
    return result  # type: ignore[no-any-return]


def is_deterministic(chat: ChatCompletionRequest) -> bool:
    """Only an answer the same request would get again may be cached."""
    return not chat.stream and (chat.temperature == 0 or chat.seed is not None)


def chat_choice(done: Completion) -> Choice:
    calls = [ChatCompletionMessageToolCall.from_call(c) for c in done.tool_calls] or None
    return Choice(
        index=done.index,
        # OpenAI's content is null when the answer is only tool calls
        message=ChatCompletionMessage(
            content=None if calls and not done.text.strip() else done.text, tool_calls=calls
        ),
        logprobs=None if done.logprobs is None else ChoiceLogprobs.from_tokens(done.logprobs),
        finish_reason=done.finish_reason,
    )


def chat_completion(model: str, choices: list[Completion]) -> ChatCompletion:
    return ChatCompletion(
        id=chat_completion_id(),
        created=created_timestamp(),
        model=model,
        choices=[chat_choice(done) for done in choices],
        usage=Usage.from_counts(
            choices[0].prompt_tokens, sum(c.completion_tokens for c in choices)
        ),
    )


@dataclass(frozen=True)
class ChatService(ModelService):
    gate: ModerationGate

    def _begin(self, chat: ChatCompletionRequest, telemetry: RequestTelemetry) -> ServedModel:
        telemetry.request(
            task="chat",
            model=chat.model,
            stream=chat.stream,
            max_tokens=chat.effective_max_tokens,
            temperature=chat.temperature,
            top_p=chat.top_p,
            seed=chat.seed,
            prompt=chat_messages_as_dicts(chat),
        )
        return self.catalogue.get(chat.model, "chat")

    async def complete(
        self,
        chat: ChatCompletionRequest,
        ctx: RequestContext,
        telemetry: RequestTelemetry,
        *,
        use_cache: bool = True,
    ) -> Answer[ChatCompletion]:
        """A whole answer; a deterministic one is cached when `use_cache`."""
        model = self._begin(chat, telemetry)
        messages, params, quota = self.admission.admit_chat(chat, ctx.principal)
        features = chat_features(chat)
        used_tokens = 0
        try:

            async def generate() -> tuple[ChatCompletion, EdgeTrace]:
                return await self._generate(model, messages, params, features, ctx, telemetry)

            if use_cache and is_deterministic(chat):
                completion, trace = await self.cached.get_or_make(
                    "chat", model.name, chat, ctx, telemetry, generate
                )
            else:
                completion, trace = await generate()
            usage = completion.usage
            used_tokens = usage.total_tokens
            telemetry.usage(
                input_tokens=usage.prompt_tokens,
                output_tokens=usage.completion_tokens,
                finish_reason=completion.choices[0].finish_reason,
            )
        finally:
            quota.settle(used_tokens)
        return Answer.of(completion, trace, quota)

    async def _generate(
        self,
        model: ServedModel,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        features: ChatFeatures,
        ctx: RequestContext,
        telemetry: RequestTelemetry,
    ) -> tuple[ChatCompletion, EdgeTrace]:
        reply, trace = await self._checked_call(
            model,
            messages,
            ctx,
            telemetry,
            lambda handle: handle.complete_choices.remote(
                messages, params, ctx.traceparent, features
            ),
        )
        choices: list[Completion] = list(reply.value)
        if self.gate.applies_to(model.name):
            for i, done in enumerate(choices):
                text, finish = await self.gate.filter_output(done.text, done.finish_reason)
                choices[i] = dataclasses.replace(done, text=text, finish_reason=finish)
        return chat_completion(model.name, choices), trace

    async def stream(
        self, chat: ChatCompletionRequest, ctx: RequestContext, telemetry: RequestTelemetry
    ) -> Answer[AsyncIterator[GenerationChunk]]:
        """The generation's chunks once its first one came: until then the edge may fail over
        and an error has a real status; after it, the route turns errors into an error event.
        The key's tokens are settled when the stream ends, fails or is abandoned."""
        model = self._begin(chat, telemetry)
        messages, params, quota = self.admission.admit_chat(chat, ctx.principal)
        features = chat_features(chat)
        try:
            (first, stream), trace = await self._checked_call(
                model,
                messages,
                ctx,
                telemetry,
                lambda handle: self._open_stream(
                    handle, messages, params, features, ctx.traceparent
                ),
                reply_of=lambda opened: opened[0],
                refused=lambda opened: opened[1].cancel(),
            )
        except BaseException:
            quota.settle(0)
            raise
        chunks = _rest(first, stream, features.n)
        if self.gate.applies_to(model.name):
            chunks = self.gate.guard_stream(chunks, features.n)
        return Answer.of(metered_stream(_observed(chunks, telemetry), quota), trace, quota)

    async def _checked_call(
        self,
        model: ServedModel,
        messages: list[dict[str, Any]],
        ctx: RequestContext,
        telemetry: RequestTelemetry,
        call: Callable[[Any], Awaitable[T]],
        reply_of: Callable[[T], Reply[Any]] = _is_reply,
        refused: Callable[[T], None] = lambda _: None,
    ) -> tuple[T, EdgeTrace]:
        """`call` on the model's handle through the edge, started while the gate checks the
        input (the check overlaps the hop to the model and its prefill); its result comes back
        only once the input passed. A refused input cancels the call, or `refused` frees what it
        already opened, and the 400 is raised whatever the call did."""
        generation = self.edge.call(model.name, ctx, telemetry, call, reply_of=reply_of)
        if not self.gate.applies_to(model.name):
            return await generation
        started = asyncio.ensure_future(generation)
        try:
            await self.gate.check_input(messages)
        except BaseException:
            if not started.done():
                started.cancel()
            elif not started.cancelled() and started.exception() is None:
                refused(started.result()[0])
            raise
        return await started

    @staticmethod
    async def _open_stream(
        handle: Any,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        features: ChatFeatures,
        traceparent: str | None,
    ) -> OpenedStream:
        stream = handle.options(stream=True).stream.remote(messages, params, traceparent, features)
        try:
            return await stream.__anext__(), stream
        except BaseException:
            stream.cancel()
            raise


async def _rest(
    first: Reply[GenerationChunk], stream: Any, choices: int
) -> AsyncIterator[GenerationChunk]:
    """The stream's chunks until each of its `choices` finished."""
    chunk = first.value
    unfinished = choices
    try:
        while True:
            yield chunk
            if chunk.finish_reason is not None:
                unfinished -= 1
                if not unfinished:
                    return
            chunk = (await stream.__anext__()).value
    finally:
        stream.cancel()  # the client left or the stream ended: free the model's slot


async def _observed(
    chunks: AsyncIterator[GenerationChunk], telemetry: RequestTelemetry
) -> AsyncIterator[GenerationChunk]:
    """Pass a stream through, telling the request's telemetry its usage or its failure."""
    try:
        async for chunk in chunks:
            if chunk.finish_reason is not None:  # with n > 1: the totals so far, last one wins
                telemetry.usage(
                    input_tokens=chunk.prompt_tokens,
                    output_tokens=chunk.completion_tokens,
                    finish_reason=chunk.finish_reason,
                )
            yield chunk
    except Exception as exc:
        telemetry.failed(exc)
        raise
