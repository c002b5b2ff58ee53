"""The `security:` settings of the router: per-key rate limits, request limits, the moderation
gate, and whether it may run open on Kubernetes (serve_config.yaml `args.security`)."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import Field, model_validator

from deployments.config.strict import StrictModel

# Past this a chat request's output alone could fill any context we serve; a cap keeps one request
# from reserving a whole minute of a key's token budget by accident.
DEFAULT_MAX_COMPLETION_TOKENS = 4096


class RateLimits(StrictModel):
    """One API key's budget, each refilled continuously (null means unlimited), and its share
    of a full model against other keys'."""

    requests_per_minute: int | None = Field(default=None, ge=1, le=10_000_000)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=10_000_000_000)
    weight: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="while a model is full, keys waiting for it are let in in proportion to "
        "their weights (router.fair_queue)",
    )


BudgetPeriod = Literal["day", "month"]


class KeyBudget(StrictModel):
    """What a key may spend per UTC day or month, in observability.prices' cost units, and what
    serves it past that: a cheaper fallback model, or nothing (429 budget_exceeded)."""

    cost_units: float = Field(gt=0, le=1e15)
    period: BudgetPeriod = "month"
    fallback_model: str | None = Field(
        default=None,
        min_length=1,
        description="past the budget, requests are served by this model instead of a 429",
    )


class ParamRange(StrictModel):
    """Inclusive bounds for a sampling parameter; they can only narrow what the protocol allows."""

    min: float
    max: float

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self

    def __contains__(self, value: float) -> bool:
        return self.min <= value <= self.max


class RequestLimits(StrictModel):
    """Bounds on one request's size, checked by the router before any model is called. The body
    size is `router.max_body_bytes` (413); input tokens per model are each model's context, which
    its runtime enforces (400 context_length_exceeded) since only it holds the tokenizer."""

    max_messages: int = Field(default=128, ge=1, le=100_000)
    max_input_chars: int = Field(
        default=200_000, ge=1, description="all messages' text of one chat request together"
    )
    max_completion_tokens: int = Field(default=DEFAULT_MAX_COMPLETION_TOKENS, ge=1)
    max_batch_items: int = Field(
        default=256, ge=1, le=2048, description="texts in one embeddings/moderation request"
    )
    max_item_chars: int = Field(default=8192, ge=1, description="characters in one of those texts")
    temperature: ParamRange = ParamRange(min=0.0, max=2.0)
    top_p: ParamRange = ParamRange(min=0.0, max=1.0)


# Where the gate's classifier runs: in each router replica (no hop; only when the moderation
# model is an embedded classifier, a vectorizer + linear graph that takes microseconds on a CPU,
# else the deployment), or always as a call of the moderation deployment (heavy guard models).
GateClassifier = Literal["in_router_if_embedded", "deployment"]


# What the gate does with a text when its classifier fails (raises or times out in the
# deployment, or the router's own copy breaks): refuse the request (503 with Retry-After), or let
# the text through unchecked and say so (x-moderation-skipped, a metric, a warning).
GateFailureMode = Literal["fail_closed", "fail_open"]


class GateFailureModes(StrictModel):
    """Per direction, what a classifier failure does. Both fail closed by default: an operator
    who put a model behind the gate asked for its text to be checked, and a gate that waves text
    through while its classifier is down is a bypass nobody sees (Cloudflare's blocking rules
    answer 503 when their scanner is down). Failing open is a choice made per direction, e.g. an
    output that may stream unchecked rather than be cut while the input is still refused."""

    input: GateFailureMode = "fail_closed"
    output: GateFailureMode = "fail_closed"
    retry_after_s: int = Field(
        default=5,
        ge=1,
        le=3600,
        description="Retry-After of the 503 a closed gate answers while its classifier fails",
    )


class ModerationGateConfig(StrictModel):
    """Which chat models have their input and output checked by the moderation model."""

    models: list[str] = Field(default_factory=list, description="chat models behind the gate")
    moderation_model: str = Field(default="moderation", min_length=1)
    classifier: GateClassifier = Field(
        default="in_router_if_embedded",
        description="in_router_if_embedded: the router loads the moderation model from "
        "models_dir when it is an embedded classifier; deployment: a call per check",
    )
    check_input: bool = True
    check_output: bool = True
    window_chars: int = Field(
        default=200,
        ge=1,
        le=100_000,
        description="streamed output is released up to its last word boundary once checked; a "
        "trailing partial word is held until it ends or reaches this length",
    )
    overlap_chars: int = Field(
        default=32,
        ge=0,
        description="tail of the text released before, classified with each new piece, so a "
        "phrase cut between pieces is still seen whole",
    )
    refusal_text: str = Field(
        default="I can't help with that.", description="replaces a flagged non-streamed answer"
    )
    on_classifier_failure: GateFailureModes = GateFailureModes()

    @model_validator(mode="after")
    def _overlap_smaller_than_window(self) -> Self:
        if self.overlap_chars >= self.window_chars:
            raise ValueError(
                f"overlap_chars ({self.overlap_chars}) must be smaller than "
                f"window_chars ({self.window_chars})"
            )
        return self


class SecurityConfig(StrictModel):
    allow_open: bool = Field(
        default=False,
        description="on Kubernetes, start even with no API key (the API open to anyone who can "
        "reach it); elsewhere an open API is always allowed, with a warning",
    )
    default_limits: RateLimits = RateLimits()
    per_key: dict[str, RateLimits] = Field(
        default_factory=dict,
        description="overrides by key id; a field left out keeps the default, null is unlimited",
    )
    request_limits: RequestLimits = RequestLimits()
    moderation_gate: ModerationGateConfig = ModerationGateConfig()

    def limits_for(self, key_id: str) -> RateLimits:
        override = self.per_key.get(key_id)
        if override is None:
            return self.default_limits
        given = {name: getattr(override, name) for name in override.model_fields_set}
        return self.default_limits.model_copy(update=given)
