"""Per-key rate limits: requests and tokens per minute as token buckets, OpenAI's x-ratelimit-*
headers, and 429 with Retry-After when a key is over its budget.

A small token bucket rather than a library: `limits` (window counters, time.time storage),
`pyrate-limiter` (leaky-bucket logs of weighted hits) and `aiolimiter` (asyncio leaky bucket on
the loop's clock) can charge a cost > 1, but none can hand back or add to a charge afterwards,
which reserving `input + max_tokens` and settling to the actual usage needs, and only some take an
injected clock. The bucket below does all three in a few lines.

The router runs on one event loop and nothing here awaits, so no lock is needed. Each router
replica holds its own buckets with 1/N of every limit (`RateLimiter(share=...)`), so across N
replicas a key gets its budget once, without a shared counter on the request path.
"""

from __future__ import annotations

import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from deployments.config.security import RateLimits
from deployments.errors import RateLimitedError
from deployments.ingress.security.keys import Principal

Clock = Callable[[], float]
SECONDS_PER_MINUTE = 60.0
# OpenAI's rule of thumb for English; the estimate only has to be close until settle() corrects it.
CHARS_PER_TOKEN = 4
# Role and template tokens a chat template adds around each message.
MESSAGE_OVERHEAD_TOKENS = 4


class TokenBucket:
    """`capacity` tokens, refilled continuously at `capacity` per minute. A charge may drive the
    level below zero (a settled request that used more than it reserved): that debt is repaid
    before the key gets anything more."""

    def __init__(self, capacity: int, clock: Clock):
        self.capacity = capacity
        self.refill_per_s = capacity / SECONDS_PER_MINUTE
        self._clock = clock
        self._level = float(capacity)
        self._updated = clock()

    def available(self) -> float:
        now = self._clock()
        self._level = min(self.capacity, self._level + (now - self._updated) * self.refill_per_s)
        self._updated = now
        return self._level

    def seconds_until(self, amount: float) -> float:
        """How long until `amount` tokens (capped at the capacity) are available."""
        missing = min(amount, self.capacity) - self.available()
        return max(0.0, missing / self.refill_per_s)

    def seconds_until_full(self) -> float:
        return self.seconds_until(self.capacity)

    def charge(self, amount: float) -> None:
        self.available()
        self._level -= amount

    def refund(self, amount: float) -> None:
        self.available()
        self._level = min(self.capacity, self._level + amount)


def format_reset(seconds: float) -> str:
    """A duration as OpenAI writes x-ratelimit-reset-*: "17ms", "1.5s", "6m0s", "1h0m0s"."""
    if seconds <= 0:
        return "0s"
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < SECONDS_PER_MINUTE:
        millis = math.ceil(seconds * 1000)
        return f"{millis / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    minutes, secs = divmod(math.ceil(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes}m{secs}s"


@dataclass
class _KeyBuckets:
    limits: RateLimits
    requests: TokenBucket | None
    tokens: TokenBucket | None

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        for kind, bucket in (("requests", self.requests), ("tokens", self.tokens)):
            if bucket is None:
                continue
            headers[f"x-ratelimit-limit-{kind}"] = str(bucket.capacity)
            headers[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(bucket.available())))
            headers[f"x-ratelimit-reset-{kind}"] = format_reset(bucket.seconds_until_full())
        return headers


class Reservation:
    """What one admitted request holds: its estimated tokens, until `settle` charges the actual
    usage instead. Settling twice changes nothing."""

    def __init__(self, key_id: str, buckets: _KeyBuckets, reserved_tokens: int):
        self.key_id = key_id
        self.reserved_tokens = reserved_tokens
        self._buckets = buckets
        self._settled = False
        self.headers = buckets.headers()  # the key's state right after admission

    def settle(self, used_tokens: int) -> None:
        """Charge `used_tokens` instead of the estimate: the difference is refunded or charged.
        A request that failed before generating anything settles with 0."""
        if self._settled:
            return
        self._settled = True
        bucket = self._buckets.tokens
        if bucket is None:
            return
        difference = used_tokens - self.reserved_tokens
        if difference > 0:
            bucket.charge(difference)
        elif difference < 0:
            bucket.refund(-difference)


class RateLimiter:
    """One request bucket and one token bucket per key id, created on first use.

    `share` is this limiter's part of each limit: a router of N replicas gives each 1/N, so the
    key's budget holds across replicas without a shared counter on the request path."""

    def __init__(self, clock: Clock = time.monotonic, share: float = 1.0):
        if not 0 < share <= 1:
            raise ValueError(f"share must be in (0, 1], got {share}")
        self._clock = clock
        self._share = share
        self._keys: dict[str, _KeyBuckets] = {}

    def _buckets(self, principal: Principal) -> _KeyBuckets:
        buckets = self._keys.get(principal.key_id)
        if buckets is None or buckets.limits != principal.limits:
            limits = principal.limits
            buckets = _KeyBuckets(
                limits,
                self._bucket(limits.requests_per_minute),
                self._bucket(limits.tokens_per_minute),
            )
            self._keys[principal.key_id] = buckets
        return buckets

    def _bucket(self, per_minute: int | None) -> TokenBucket | None:
        if per_minute is None:
            return None
        return TokenBucket(max(1, math.ceil(per_minute * self._share)), self._clock)

    def reserve(self, principal: Principal, estimated_tokens: int) -> Reservation:
        """Admit one request that may use `estimated_tokens`, or raise RateLimitedError (429).

        A request estimated above the key's whole token budget is admitted once the bucket is
        full and charged the budget; settle() then charges what it really used."""
        buckets = self._buckets(principal)
        tokens = estimated_tokens
        if buckets.tokens is not None:
            tokens = min(estimated_tokens, buckets.tokens.capacity)
        waits: list[tuple[float, str]] = []
        if buckets.requests is not None and buckets.requests.available() < 1:
            limit = buckets.requests.capacity
            waits.append((buckets.requests.seconds_until(1), f"requests per minute ({limit})"))
        if buckets.tokens is not None and buckets.tokens.available() < tokens:
            limit = buckets.tokens.capacity
            waits.append(
                (
                    buckets.tokens.seconds_until(tokens),
                    f"tokens per minute ({limit}; this request needs {tokens})",
                )
            )
        if waits:
            raise self._limited(principal, buckets, waits)
        if buckets.requests is not None:
            buckets.requests.charge(1)
        if buckets.tokens is not None:
            buckets.tokens.charge(tokens)
        return Reservation(principal.key_id, buckets, tokens)

    def headers(self, principal: Principal) -> dict[str, str]:
        """The key's x-ratelimit-* headers now, without charging anything."""
        return self._buckets(principal).headers()

    @staticmethod
    def _limited(
        principal: Principal, buckets: _KeyBuckets, waits: Sequence[tuple[float, str]]
    ) -> RateLimitedError:
        retry_after_s = max(wait for wait, _ in waits)
        what = " and ".join(kind for _, kind in waits)
        return RateLimitedError(
            f"rate limit reached for key {principal.key_id} on {what}; "
            f"retry in {format_reset(retry_after_s)}",
            retry_after_s=retry_after_s,
            headers=buckets.headers(),
        )


def estimate_text_tokens(texts: Sequence[str]) -> int:
    return sum(math.ceil(len(text) / CHARS_PER_TOKEN) for text in texts)


def estimate_chat_tokens(
    message_texts: Sequence[str], max_tokens: int | None, default_max_tokens: int
) -> int:
    """What a chat request may use at most, before it is tokenized: its input, estimated, plus
    the completion it may ask for."""
    prompt = estimate_text_tokens(message_texts) + MESSAGE_OVERHEAD_TOKENS * len(message_texts)
    return prompt + (max_tokens if max_tokens is not None else default_max_tokens)


class Usage(Protocol):
    """What a generation chunk reports of its usage so far (GenerationChunk has both)."""

    @property
    def prompt_tokens(self) -> int: ...

    @property
    def completion_tokens(self) -> int: ...


ChunkT = TypeVar("ChunkT", bound=Usage)


async def metered_stream(
    chunks: AsyncIterator[ChunkT], reservation: Reservation
) -> AsyncIterator[ChunkT]:
    """Pass a generation through, then settle the reservation to the usage of its last chunk,
    however it ends: finished, failed, or abandoned by the client (0 if nothing came)."""
    used = 0
    try:
        async for chunk in chunks:
            used = chunk.prompt_tokens + chunk.completion_tokens
            yield chunk
    finally:
        reservation.settle(used)
        close = getattr(chunks, "aclose", None)
        if close is not None:
            await close()
