"""Admission: a request's limits (400), the models its key may use (403) and the key's budget
(429, or the key's fallback model), then its key's rate limit (429) with the tokens it may use.
The caller settles the returned reservation in a `finally`, with what the request really used;
the budget's reservation is settled with the request's ledger record (deployments.ingress.state)."""

from __future__ import annotations

from typing import Any, NamedTuple

from deployments.contracts.chat_features import ChatFeatures
from deployments.contracts.sampling_params import DEFAULT_MAX_NEW_TOKENS, SamplingParams
from deployments.errors import PermissionDeniedError
from deployments.ingress.protocol import ChatCompletionRequest, chat_messages_as_dicts
from deployments.ingress.security import (
    Principal,
    RateLimiter,
    RequestLimits,
    Reservation,
    check_chat,
    check_texts,
    estimate_chat_tokens,
    estimate_text_tokens,
)
from deployments.ingress.serving.context import RequestContext
from deployments.ingress.serving.models import ModelCatalogue, ServedModel
from deployments.ingress.state.budgets import BudgetGuard


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


def check_allowed(principal: Principal, model: ServedModel) -> None:
    """The key may use the model, or a 403."""
    if not principal.may_use(model.name):
        raise PermissionDeniedError(
            f"key {principal.key_id} may not use the model {model.name!r}",
            param="model",
            code="model_not_allowed",
        )


class AdmittedChat(NamedTuple):
    model: ServedModel  # the key's fallback model when its budget is spent
    messages: list[dict[str, Any]]  # as the model takes them
    params: SamplingParams
    quota: Reservation  # the key's rate-limit reservation of input + max output
    fallback: bool  # served by the key's fallback model: its answer is not the cache's


class AdmittedTexts(NamedTuple):
    model: ServedModel
    quota: Reservation
    fallback: bool


class Admission:
    """`budgets`: the virtual keys' budgets (None: gateway state off, no key has one)."""

    def __init__(
        self,
        limiter: RateLimiter,
        limits: RequestLimits,
        catalogue: ModelCatalogue,
        budgets: BudgetGuard | None = None,
    ):
        self.limiter = limiter
        self.limits = limits
        self.catalogue = catalogue
        self.budgets = budgets

    async def admit_chat(
        self,
        chat: ChatCompletionRequest,
        model: ServedModel,
        ctx: RequestContext,
    ) -> AdmittedChat:
        check_chat(chat, self.limits)
        messages = chat_messages_as_dicts(chat)
        texts = [m["content"] for m in messages]
        prompt = estimate_chat_tokens(texts, 0, 0)
        output = chat.effective_max_tokens or DEFAULT_MAX_NEW_TOKENS
        served = await self._spend(model, ctx, prompt, output * chat.n)
        estimate = estimate_chat_tokens(texts, chat.effective_max_tokens, DEFAULT_MAX_NEW_TOKENS)
        estimate = estimate * chat.n  # n choices may each use the whole output budget
        quota = self.limiter.reserve(ctx.principal, estimate)
        return AdmittedChat(served, messages, sampling_params(chat), quota, served is not model)

    async def admit_texts(
        self,
        texts: list[str],
        model: ServedModel,
        ctx: RequestContext,
    ) -> AdmittedTexts:
        check_texts(texts, self.limits)
        estimate = estimate_text_tokens(texts)
        served = await self._spend(model, ctx, estimate, 0)
        return AdmittedTexts(
            served, self.limiter.reserve(ctx.principal, estimate), served is not model
        )

    async def _spend(
        self,
        model: ServedModel,
        ctx: RequestContext,
        input_tokens: int,
        output_tokens: int,
    ) -> ServedModel:
        """The key may use the model (403), and its budget holds the request's estimated cost
        (reserved), or the key's fallback model serves it, or it is refused (429)."""
        principal, telemetry = ctx.principal, ctx.telemetry
        check_allowed(principal, model)
        if self.budgets is None or principal.budget is None:
            telemetry.spend_admitted(model.name, None, 0.0)
            return model
        spend = await self.budgets.admit(principal, model.name, input_tokens, output_tokens)
        telemetry.spend_admitted(spend.model, spend.period, spend.reserved_cost_units)
        return model if spend.model == model.name else self.catalogue.get(spend.model, model.task)
