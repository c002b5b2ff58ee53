"""Chat for both APIs: a whole answer through the one model-service path (`ModelService.serve`:
admission, the cache for deterministic requests, the edge, the settlement of the key's tokens),
with the moderation gate before the model (`_dispatch`) and on its output (`_answer`); a stream
through the same admission and gated dispatch, its tokens settled when it ends."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

from deployments.contracts.chat_deployment import ChatClient, ChatRequest
from deployments.contracts.outputs import Completion, GenerationChunk
from deployments.ingress.edge.calls import AnyCall, CallResult, ModelCall, StreamCall
from deployments.ingress.edge.trace import EdgeTrace
from deployments.ingress.protocol import (
    ChatCompletion,
    ChatCompletionMessage,
    ChatCompletionMessageToolCall,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    PromptTokenLogprob,
    Usage,
    chat_completion_id,
    chat_messages_as_dicts,
    created_timestamp,
)
from deployments.ingress.security import ModerationGate, Reservation, metered_stream
from deployments.ingress.security.gate_failures import skipped_header
from deployments.ingress.serving.admission import AdmittedChat, chat_features
from deployments.ingress.serving.answer import Answer
from deployments.ingress.serving.base import ModelService
from deployments.ingress.serving.context import RequestContext
from deployments.ingress.serving.models import ServedModel
from deployments.observability import RequestTelemetry


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
    prompt_logprobs = choices[0].prompt_logprobs
    return ChatCompletion(
        id=chat_completion_id(),
        created=created_timestamp(),
        model=model,
        choices=[chat_choice(done) for done in choices],
        usage=Usage.from_counts(
            choices[0].prompt_tokens,
            sum(c.completion_tokens for c in choices),
            choices[0].cached_tokens,
        ),
        prompt_logprobs=None
        if prompt_logprobs is None
        else PromptTokenLogprob.from_tokens(prompt_logprobs),
    )


@dataclass(frozen=True)
class ChatService(ModelService[ChatCompletionRequest, AdmittedChat, ChatCompletion]):
    gate: ModerationGate

    task = "chat"

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
        self, chat: ChatCompletionRequest, ctx: RequestContext, *, use_cache: bool = True
    ) -> Answer[ChatCompletion]:
        """A whole answer; a deterministic one is cached when `use_cache`."""
        admitted = await self.admission.admit_chat(chat, self._begin(chat, ctx.telemetry), ctx)
        model, messages, params, quota, fallback = admitted
        features = chat_features(chat)
        call = ModelCall(
            ChatClient.complete_choices,
            ChatRequest(messages, params, ctx.traceparent, features),
            session=ctx.session,
        )
        cacheable = use_cache and is_deterministic(chat)
        answer = await self.serve(chat, ctx, admitted, call, cacheable=cacheable)
        return answer.with_headers(skipped_header(ctx.moderation_skipped))

    async def _answer(
        self,
        chat: ChatCompletionRequest,
        admitted: AdmittedChat,
        reply: list[Completion],
        ctx: RequestContext,
    ) -> ChatCompletion:
        """The answer of the model's choices, each passed through the output gate if it applies,
        named as the client asked for the model (its name or an alias), as a stream's chunks are;
        a key's fallback answers as the model that served, not the one its budget refused."""
        model = admitted.model
        asked_as = model.name if admitted.fallback else chat.model
        choices = list(reply)
        if self.gate.applies_to(model.name):
            for i, done in enumerate(choices):
                text, finish = await self.gate.filter_output(
                    done.text, done.finish_reason, ctx.moderation_skipped.add
                )
                choices[i] = dataclasses.replace(done, text=text, finish_reason=finish)
        return chat_completion(asked_as, choices)

    def _whole(self, answer: ChatCompletion, ctx: RequestContext) -> bool:
        """An answer the output gate cut in any choice, or that went unchecked on a side (its
        classifier failed open), is never cached nor shared: a later hit would not say so."""
        if ctx.moderation_skipped:
            return False
        return all(choice.finish_reason != "content_filter" for choice in answer.choices)

    def _used_tokens(self, answer: ChatCompletion, quota: Reservation) -> int:
        return answer.usage.total_tokens

    def _report_usage(self, answer: ChatCompletion, telemetry: RequestTelemetry) -> None:
        usage = answer.usage
        telemetry.usage(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            finish_reason=answer.choices[0].finish_reason,
        )

    async def stream(
        self,
        chat: ChatCompletionRequest,
        ctx: RequestContext,
    ) -> Answer[AsyncIterator[GenerationChunk]]:
        """The generation's chunks once its first one came: until then the edge may fail over
        and an error has a real status; after it, the route turns errors into an error event.
        `ctx.warming` is set if the edge waits for a cold replica meanwhile. No cache; the key's
        tokens are settled when the stream ends, fails or is abandoned (`metered_stream`), or at
        once if it never opened."""
        admitted = await self.admission.admit_chat(chat, self._begin(chat, ctx.telemetry), ctx)
        model, messages, params, quota, _ = admitted
        features = chat_features(chat)
        call = StreamCall(
            ChatClient.stream,
            ChatRequest(messages, params, ctx.traceparent, features),
            session=ctx.session,
        )
        try:
            opened, trace = await self._dispatch(admitted, ctx, call)
        except BaseException:
            quota.settle(0)
            raise
        chunks = _rest(opened, features.n)
        if self.gate.applies_to(model.name):
            # the output's skip comes after the headers: the metric and the warning tell it
            chunks = self.gate.guard_stream(chunks, features.n, ctx.moderation_skipped.add)
        answer = Answer.of(metered_stream(_observed(chunks, ctx.telemetry), quota), trace, quota)
        return answer.with_headers(skipped_header(ctx.moderation_skipped))

    async def _dispatch(
        self,
        admitted: AdmittedChat,
        ctx: RequestContext,
        call: AnyCall,
    ) -> tuple[CallResult, EdgeTrace]:
        """`call` through the edge, started while the gate checks the input (the check overlaps
        the hop to the model and its prefill); its result comes back only once the input passed.
        A refused input cancels the call, or closes the stream it already opened, and the 400 is
        raised whatever the call did. Until the input passed, the request's `warming` event is
        held: a stream starts only once its input passed, so a refusal stays a 400."""
        model, notice = admitted.model.name, ctx.warming
        if not self.gate.applies_to(model):
            return await self.edge.dispatch(model, ctx, call)
        notice.hold()
        started = asyncio.ensure_future(self.edge.dispatch(model, ctx, call))
        try:
            # One turn of the loop: the dispatch sends the call before the check starts. The
            # router's own classifier never yields, so without it the call left only after it.
            await asyncio.sleep(0)
            await self.gate.check_input(admitted.messages, ctx.moderation_skipped.add)
            notice.release()
        except BaseException:
            if not started.done():
                started.cancel()
            elif not started.cancelled() and started.exception() is None:
                started.result()[0].close()
            raise
        return await started


async def _rest(opened: CallResult, choices: int) -> AsyncIterator[GenerationChunk]:
    """The stream's chunks, from the first one the edge waited for, until each of its `choices`
    finished."""
    chunk = opened.reply.value
    unfinished = choices
    try:
        while True:
            yield chunk
            if chunk.finish_reason is not None:
                unfinished -= 1
                if not unfinished:
                    return
            chunk = (await opened.rest.__anext__()).value
    finally:
        opened.close()  # the client left or the stream ended: free the model's slot


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
