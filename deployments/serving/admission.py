"""Admission: a request's limits (400), then its key's rate limit (429) with the tokens it may use.
The caller settles the returned reservation in a `finally`, with what the request really used."""

from __future__ import annotations

from typing import Any

from deployments.protocol import ChatCompletionRequest, chat_messages_as_dicts
from deployments.runtime.chat_features import ChatFeatures
from deployments.runtime.sampling_params import DEFAULT_MAX_NEW_TOKENS, SamplingParams
from deployments.security import (
    Principal,
    RateLimiter,
    RequestLimits,
    Reservation,
    check_chat,
    check_texts,
    estimate_chat_tokens,
    estimate_text_tokens,
)


def sampling_params(chat: ChatCompletionRequest) -> SamplingParams:
    return SamplingParams(
        max_tokens=chat.effective_max_tokens,
        temperature=chat.temperature,
        top_p=chat.top_p,
        top_k=chat.top_k,
        # OpenAI takes any int64 seed; numpy's generator wants a non-negative one.
        seed=None if chat.seed is None else chat.seed % 2**64,
        stop=chat.stop_sequences,
        frequency_penalty=chat.frequency_penalty,
        presence_penalty=chat.presence_penalty,
        repetition_penalty=chat.repetition_penalty,
        logit_bias=SamplingParams.bias_from(chat.logit_bias),
        logprobs=chat.logprobs,
        top_logprobs=chat.top_logprobs or 0,
        prompt_logprobs=chat.prompt_logprobs,
    )


def chat_features(chat: ChatCompletionRequest) -> ChatFeatures:
    """What the request asks beyond sampling, as the chat replica takes it."""
    return ChatFeatures(
        n=chat.n,
        tools=chat.tool_dicts,
        tool_choice=chat.tool_choice_name,
        parallel_tool_calls=chat.parallel_tool_calls,
        response_format=chat.response_format.as_dict() if chat.response_format else None,
        raw=chat.raw,
    )


class Admission:
    def __init__(self, limiter: RateLimiter, limits: RequestLimits):
        self.limiter = limiter
        self.limits = limits

    def admit_chat(
        self, chat: ChatCompletionRequest, principal: Principal
    ) -> tuple[list[dict[str, Any]], SamplingParams, Reservation]:
        """(messages as the model takes them, sampling, the reservation of input + max output)."""
        check_chat(chat, self.limits)
        messages = chat_messages_as_dicts(chat)
        estimate = estimate_chat_tokens(
            [m["content"] for m in messages], chat.effective_max_tokens, DEFAULT_MAX_NEW_TOKENS
        )
        estimate = estimate * chat.n  # n choices may each use the whole output budget
        return messages, sampling_params(chat), self.limiter.reserve(principal, estimate)

    def admit_texts(self, texts: list[str], principal: Principal) -> Reservation:
        check_texts(texts, self.limits)
        return self.limiter.reserve(principal, estimate_text_tokens(texts))
