"""The router's security layer, free of Ray and HTTP: API keys (and whether it may run without
any), per-key rate limits, request limits and the moderation gate of chat models."""

from deployments.config.security import (
    KeyBudget,
    ModerationGateConfig,
    ParamRange,
    RateLimits,
    RequestLimits,
    SecurityConfig,
)
from deployments.errors import ContentPolicyViolationError, RateLimitedError
from deployments.ingress.security.keys import (
    ADMIN_KEY_ENV,
    API_KEYS_ENV,
    API_KEYS_FILE_ENV,
    KeyConfigError,
    KeyStore,
    Principal,
    VirtualKeyLookup,
    bearer_token,
    key_digest,
)
from deployments.ingress.security.moderation_gate import Classify, ModerationGate
from deployments.ingress.security.open_mode import KUBERNETES_ENV, on_kubernetes, open_start_refusal
from deployments.ingress.security.rate_limit import (
    RateLimiter,
    Reservation,
    estimate_chat_tokens,
    estimate_text_tokens,
    format_reset,
    metered_stream,
)
from deployments.ingress.security.request_limits import check_chat, check_texts

__all__ = [
    "ADMIN_KEY_ENV",
    "API_KEYS_ENV",
    "API_KEYS_FILE_ENV",
    "Classify",
    "ContentPolicyViolationError",
    "KeyBudget",
    "KeyConfigError",
    "KUBERNETES_ENV",
    "KeyStore",
    "ModerationGate",
    "ModerationGateConfig",
    "ParamRange",
    "Principal",
    "RateLimits",
    "RateLimitedError",
    "RateLimiter",
    "RequestLimits",
    "Reservation",
    "VirtualKeyLookup",
    "SecurityConfig",
    "bearer_token",
    "key_digest",
    "check_chat",
    "check_texts",
    "estimate_chat_tokens",
    "estimate_text_tokens",
    "format_reset",
    "metered_stream",
    "on_kubernetes",
    "open_start_refusal",
]
