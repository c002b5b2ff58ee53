"""The security layer without Ray: API keys, per-key rate limits on a fake clock, request limits
and the moderation gate with a fake classifier."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import ValidationError

from deployments.contracts.outputs import GenerationChunk
from deployments.errors import (
    AuthenticationError,
    InvalidRequestError,
    InvalidUTF8Error,
    PermissionDeniedError,
    RouteNotFoundError,
)
from deployments.ingress.protocol import ChatCompletionRequest
from deployments.ingress.security import (
    KUBERNETES_ENV,
    ContentPolicyViolationError,
    KeyConfigError,
    KeyStore,
    ModerationGate,
    ModerationGateConfig,
    ParamRange,
    Principal,
    RateLimitedError,
    RateLimiter,
    RateLimits,
    RequestLimits,
    SecurityConfig,
    check_chat,
    check_texts,
    estimate_chat_tokens,
    format_reset,
    metered_stream,
    on_kubernetes,
    open_start_refusal,
)
from deployments.ingress.security.moderation_gate import held_unspaced, releasable_length

ALICE = "sk-alice-0123456789abcdef"
BOB = "sk-bob-fedcba9876543210"
ADMIN = "sk-admin-5555aaaa5555aaaa"


def hex_id(secret: str) -> str:
    return "key-" + hashlib.sha256(secret.encode()).hexdigest()[:8]


def store_from(env: dict[str, str], **kwargs: Any) -> KeyStore:
    return KeyStore.from_env(env, log=logging.getLogger("test.security"), **kwargs)


# ---- API keys -------------------------------------------------------------------------------


def test_keys_from_env_get_their_name_or_a_hash_prefix_as_id():
    store = store_from({"EDGE_API_KEYS": f" alice:{ALICE} , {BOB},, "})
    assert store.key_ids == tuple(sorted(["alice", hex_id(BOB)]))
    assert store.authenticate(f"Bearer {ALICE}").key_id == "alice"
    assert store.authenticate(f"bearer   {BOB} ").key_id == hex_id(BOB)


def test_keys_from_a_file_with_comments_and_blank_lines(tmp_path):
    key_with_hash = "sk-has#hash-0000000000"
    key_with_colon = "sk:with:colons-00000000"
    path = tmp_path / "keys.txt"
    path.write_text(
        f"# team keys\n\n  carol:{ALICE}\n{key_with_hash}\n  # old: {BOB}\nops:{key_with_colon}\n",
        encoding="utf-8",
    )
    store = store_from({"EDGE_API_KEYS_FILE": str(path), "EDGE_API_KEYS": f"dave:{ADMIN}x"})
    assert set(store.key_ids) == {"carol", "dave", "ops", hex_id(key_with_hash)}
    assert store.authenticate(f"Bearer {ALICE}").key_id == "carol"
    assert store.authenticate(f"Bearer {key_with_hash}").key_id == hex_id(key_with_hash)
    assert store.authenticate(f"Bearer {key_with_colon}").key_id == "ops"
    with pytest.raises(AuthenticationError):
        store.authenticate(f"Bearer {BOB}")  # commented out


def test_only_digests_are_kept():
    store = store_from({"EDGE_API_KEYS": f"alice:{ALICE},{BOB}", "EDGE_ADMIN_KEY": ADMIN})
    held = repr(vars(store))
    for secret in (ALICE, BOB, ADMIN):
        assert secret not in held
    digests = {entry.digest for entry in store._entries}
    assert digests == {hashlib.sha256(s.encode()).digest() for s in (ALICE, BOB)}


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, "missing_api_key"),
        ("", "missing_api_key"),
        ("Bearer ", "missing_api_key"),
        (f"Basic {ALICE}", "missing_api_key"),
        ("Bearer sk-not-a-key-00000000000", "invalid_api_key"),
        (f"Bearer {ALICE}x", "invalid_api_key"),
        (f"Bearer {ADMIN}", "invalid_api_key"),  # the admin key is no user key
    ],
)
def test_missing_or_unknown_keys_get_401(header, code):
    store = store_from({"EDGE_API_KEYS": ALICE, "EDGE_ADMIN_KEY": ADMIN})
    with pytest.raises(AuthenticationError) as caught:
        store.authenticate(header)
    error = caught.value
    assert (error.status, error.code) == (401, code)
    assert error.to_error_body()["error"]["type"] == "authentication_error"
    assert ALICE not in error.message and ADMIN not in error.message


def test_admin_and_user_keys_are_separate():
    store = store_from({"EDGE_API_KEYS": f"alice:{ALICE}", "EDGE_ADMIN_KEY": ADMIN})
    admin = store.authorize_admin(f"Bearer {ADMIN}")
    assert admin.is_admin and admin.key_id == "admin"
    with pytest.raises(PermissionDeniedError) as denied:
        store.authorize_admin(f"Bearer {ALICE}")
    assert denied.value.status == 403
    for header in (None, f"Bearer {BOB}"):
        with pytest.raises(AuthenticationError) as unknown:
            store.authorize_admin(header)
        assert unknown.value.status == 401


def test_without_an_admin_key_the_admin_api_does_not_exist():
    store = store_from({"EDGE_API_KEYS": ALICE})
    for header in (None, f"Bearer {ALICE}", f"Bearer {ADMIN}"):
        with pytest.raises(RouteNotFoundError) as missing:
            store.authorize_admin(header, path="/admin/colos")
        assert missing.value.status == 404
        assert missing.value.code == "route_not_found"
        assert "/admin/colos" in missing.value.message


def test_open_admin_api_still_needs_the_admin_key():
    store = store_from({"EDGE_ADMIN_KEY": ADMIN})
    assert store.is_open
    assert store.authorize_admin(f"Bearer {ADMIN}").is_admin
    with pytest.raises(AuthenticationError):
        store.authorize_admin(f"Bearer {ALICE}")


def test_no_keys_means_open_with_a_loud_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="test.security"):
        store = store_from({"EDGE_API_KEYS": " , "})
    assert store.is_open
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any("OPEN" in r.getMessage() for r in warnings)
    for header in (None, "Bearer anything"):
        principal = store.authenticate(header)
        assert principal.key_id == "anonymous"
        assert principal.limits == RateLimits()  # default_limits are per client, not global


def test_open_api_is_limited_only_by_an_explicit_anonymous_entry():
    config = SecurityConfig(
        default_limits=RateLimits(requests_per_minute=5),
        per_key={"anonymous": RateLimits(requests_per_minute=100)},
    )
    assert store_from({}, config=config).authenticate(None).limits.requests_per_minute == 100


def test_configured_keys_log_no_open_warning_and_no_secret(caplog):
    with caplog.at_level(logging.INFO, logger="test.security"):
        store_from({"EDGE_API_KEYS": f"alice:{ALICE}"})
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "OPEN" not in text and "alice" in text and ALICE not in text


def test_short_keys_are_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="test.security"):
        store_from({"EDGE_API_KEYS": "tiny:abc"})
    assert any("tiny" in r.getMessage() for r in caplog.records)


def test_an_unreadable_key_file_stops_the_start(tmp_path):
    with pytest.raises(KeyConfigError, match="EDGE_API_KEYS_FILE"):
        store_from({"EDGE_API_KEYS_FILE": str(tmp_path / "missing.txt")})


def _key_file_error(env: dict[str, str]) -> str:
    with pytest.raises(KeyConfigError) as caught:
        store_from(env)
    message = str(caught.value)
    assert "\n" not in message and ALICE not in message
    return message


def test_each_key_file_failure_says_what_is_wrong(tmp_path, monkeypatch):
    missing = tmp_path / "keys" / "api-keys"
    assert "no such file" in _key_file_error({"EDGE_API_KEYS_FILE": str(missing)})
    assert str(missing) in _key_file_error({"EDGE_API_KEYS_FILE": str(missing)})
    missing.parent.mkdir()
    assert "is a directory" in _key_file_error({"EDGE_API_KEYS_FILE": str(missing.parent)})
    missing.write_bytes(b"alice:\xff\xfe" + ALICE.encode())
    assert "not UTF-8" in _key_file_error({"EDGE_API_KEYS_FILE": str(missing)})
    missing.write_text("# rotated out\n\n", encoding="utf-8")
    assert "holds no key" in _key_file_error({"EDGE_API_KEYS_FILE": str(missing)})
    missing.write_text(f"alice:{ALICE}\n", encoding="utf-8")

    def _denied(self: object, *args: object, **kwargs: object) -> str:
        raise PermissionError(13, "Permission denied")

    # Tests may run as root, whom no file mode stops: the OS's refusal is simulated.
    monkeypatch.setattr(type(missing), "read_text", _denied)
    message = _key_file_error({"EDGE_API_KEYS_FILE": str(missing)})
    assert "not readable by this process" in message and "defaultMode" in message


def test_a_key_file_readable_by_everyone_is_warned_about(tmp_path, caplog):
    path = tmp_path / "api-keys"
    path.write_text(f"alice:{ALICE}\n", encoding="utf-8")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="test.security"):
        store = store_from({"EDGE_API_KEYS_FILE": str(path)})
    assert store.key_ids == ("alice",)
    assert any("readable by every user" in r.getMessage() for r in caplog.records)
    caplog.clear()
    path.chmod(0o440)  # what the Kubernetes Secret volume gives it
    with caplog.at_level(logging.WARNING, logger="test.security"):
        store_from({"EDGE_API_KEYS_FILE": str(path)})
    assert not caplog.records


# ---- open mode on Kubernetes ----------------------------------------------------------------

ON_K8S = {KUBERNETES_ENV: "10.96.0.1"}


@pytest.mark.parametrize(
    ("environ", "has_keys", "allow_open", "refused"),
    [
        (ON_K8S, False, False, True),
        (ON_K8S, True, False, False),
        (ON_K8S, False, True, False),
        ({}, False, False, False),
        ({KUBERNETES_ENV: " "}, False, False, False),
    ],
)
def test_open_start_is_refused_only_on_kubernetes_without_keys_or_consent(
    environ, has_keys, allow_open, refused
):
    reason = open_start_refusal(environ, has_keys=has_keys, allow_open=allow_open)
    assert (reason is not None) == refused
    assert on_kubernetes(environ) == (KUBERNETES_ENV in environ and environ[KUBERNETES_ENV] != " ")


def test_router_keys_on_kubernetes_without_any_key_stop_the_start_in_one_line(caplog):
    with (
        caplog.at_level(logging.ERROR, logger="test.security"),
        pytest.raises(KeyConfigError) as caught,
    ):
        store_from({**ON_K8S, "EDGE_API_KEYS": " , ", "EDGE_ADMIN_KEY": ADMIN})
    message = str(caught.value)
    assert message.startswith("refusing to start: on Kubernetes")
    assert "\n" not in message and ADMIN not in message
    assert "EDGE_API_KEYS_FILE" in message and "security.allow_open: true" in message
    assert [r.getMessage() for r in caplog.records] == [message]


def test_on_kubernetes_keys_from_the_secret_file_or_explicit_consent_start(tmp_path, caplog):
    path = tmp_path / "api-keys"
    path.write_text(f"alice:{ALICE}\n", encoding="utf-8")
    path.chmod(0o440)
    store = store_from({**ON_K8S, "EDGE_API_KEYS_FILE": str(path), "EDGE_ADMIN_KEY": ADMIN})
    assert store.key_ids == ("alice",)
    assert store.authorize_admin(f"Bearer {ADMIN}").is_admin
    with caplog.at_level(logging.WARNING, logger="test.security"):
        store = store_from(ON_K8S, config=SecurityConfig(allow_open=True))
    assert store.is_open
    assert any("OPEN" in r.getMessage() for r in caplog.records)


def test_allow_open_is_a_strict_boolean():
    assert SecurityConfig().allow_open is False
    with pytest.raises(ValidationError):
        SecurityConfig(allow_open="sometimes")


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"EDGE_API_KEYS": f"{ALICE},{ALICE}"}, "twice"),
        ({"EDGE_API_KEYS": f"a:{ALICE},a:{BOB}"}, "id 'a'"),
        ({"EDGE_API_KEYS": f"anonymous:{ALICE}"}, "reserved"),
        ({"EDGE_API_KEYS": ALICE, "EDGE_ADMIN_KEY": ALICE}, "differ"),
        ({"EDGE_API_KEYS": "bad name:sekrit-part-0000"}, "name"),
        ({"EDGE_API_KEYS": "alice:"}, "empty"),
    ],
)
def test_bad_key_sources_are_refused_without_echoing_secrets(env, match):
    with pytest.raises(KeyConfigError, match=match) as caught:
        store_from(env)
    assert ALICE not in str(caught.value) and "sekrit" not in str(caught.value)


def test_per_key_overrides_merge_with_the_defaults():
    config = SecurityConfig(
        default_limits=RateLimits(requests_per_minute=60, tokens_per_minute=1000),
        per_key={"alice": RateLimits(tokens_per_minute=50_000), "bob": RateLimits()},
    )
    store = store_from({"EDGE_API_KEYS": f"alice:{ALICE},bob:{BOB},carol:{ADMIN}"}, config=config)
    assert store.authenticate(f"Bearer {ALICE}").limits == RateLimits(
        requests_per_minute=60, tokens_per_minute=50_000
    )
    # An override that names no field changes nothing; carol has none at all.
    assert store.authenticate(f"Bearer {BOB}").limits == config.default_limits
    assert store.authenticate(f"Bearer {ADMIN}").limits == config.default_limits
    unlimited = SecurityConfig(
        default_limits=RateLimits(requests_per_minute=60),
        per_key={"alice": RateLimits(requests_per_minute=None)},
    )
    assert unlimited.limits_for("alice").requests_per_minute is None


# ---- rate limits ----------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def principal(rpm: int | None = None, tpm: int | None = None, key_id: str = "alice") -> Principal:
    return Principal(key_id, RateLimits(requests_per_minute=rpm, tokens_per_minute=tpm))


def test_requests_per_minute_exhaust_and_recover():
    clock = FakeClock()
    limiter, who = RateLimiter(clock), principal(rpm=3)
    remaining = [limiter.reserve(who, 0).headers["x-ratelimit-remaining-requests"] for _ in "abc"]
    assert remaining == ["2", "1", "0"]
    with pytest.raises(RateLimitedError) as limited:
        limiter.reserve(who, 0)
    error = limited.value
    per_request_s = 60 / 3
    assert error.status == 429 and error.code == "rate_limit_exceeded"
    assert error.retry_after_s == pytest.approx(per_request_s)
    headers = error.response_headers()
    assert headers["retry-after"] == str(int(per_request_s))
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "1m0s"
    assert "x-ratelimit-limit-tokens" not in headers  # no token limit configured
    clock.advance(per_request_s - 0.1)
    with pytest.raises(RateLimitedError) as still:
        limiter.reserve(who, 0)
    assert still.value.retry_after_s == pytest.approx(0.1)
    assert still.value.response_headers()["retry-after"] == "1"  # never 0
    clock.advance(0.1)
    assert limiter.reserve(who, 0).headers["x-ratelimit-remaining-requests"] == "0"


def test_a_refused_request_consumes_nothing():
    clock = FakeClock()
    limiter, who = RateLimiter(clock), principal(rpm=10, tpm=100)
    limiter.reserve(who, 90)
    for _ in range(5):
        with pytest.raises(RateLimitedError):
            limiter.reserve(who, 50)
    assert limiter.headers(who)["x-ratelimit-remaining-requests"] == "9"
    assert limiter.headers(who)["x-ratelimit-remaining-tokens"] == "10"


def test_tokens_are_reserved_then_settled_to_actual_usage():
    clock = FakeClock()
    tpm = 1200
    per_s = tpm / 60
    limiter, who = RateLimiter(clock), principal(tpm=tpm)
    first = limiter.reserve(who, 700)
    assert first.headers["x-ratelimit-remaining-tokens"] == "500"
    assert first.headers["x-ratelimit-limit-tokens"] == str(tpm)
    assert first.headers["x-ratelimit-reset-tokens"] == format_reset(700 / per_s)
    with pytest.raises(RateLimitedError) as limited:
        limiter.reserve(who, 700)
    assert limited.value.retry_after_s == pytest.approx((700 - 500) / per_s)
    assert "tokens per minute" in limited.value.message
    first.settle(100)  # used far less than reserved: the rest comes back
    first.settle(0)  # a second settle changes nothing
    assert limiter.headers(who)["x-ratelimit-remaining-tokens"] == "1100"
    second = limiter.reserve(who, 700)
    second.settle(1000)  # used more than reserved: the difference is charged too
    assert limiter.headers(who)["x-ratelimit-remaining-tokens"] == str(1100 - 1000)
    with pytest.raises(RateLimitedError) as limited_again:
        limiter.reserve(who, 101)
    assert limited_again.value.retry_after_s == pytest.approx(1 / per_s)
    clock.advance(60)
    assert limiter.headers(who)["x-ratelimit-remaining-tokens"] == str(tpm)


def test_debt_is_repaid_before_new_requests():
    clock = FakeClock()
    tpm, per_s = 600, 10.0
    limiter, who = RateLimiter(clock), principal(tpm=tpm)
    limiter.reserve(who, 600).settle(900)  # 300 tokens of debt
    with pytest.raises(RateLimitedError) as limited:
        limiter.reserve(who, 100)
    assert limited.value.retry_after_s == pytest.approx((300 + 100) / per_s)
    assert limited.value.response_headers()["x-ratelimit-remaining-tokens"] == "0"
    clock.advance((300 + 100) / per_s)
    limiter.reserve(who, 100)


def test_a_request_larger_than_the_budget_waits_for_a_full_bucket():
    clock = FakeClock()
    limiter, who = RateLimiter(clock), principal(tpm=600)
    limiter.reserve(who, 300)
    with pytest.raises(RateLimitedError) as limited:
        limiter.reserve(who, 5000)
    assert limited.value.retry_after_s == pytest.approx(300 / 10)  # until full, not forever
    clock.advance(30)
    big = limiter.reserve(who, 5000)
    assert big.reserved_tokens == 600


def test_keys_have_their_own_buckets_and_unlimited_keys_none():
    clock = FakeClock()
    limiter = RateLimiter(clock)
    limiter.reserve(principal(rpm=1, key_id="alice"), 0)
    with pytest.raises(RateLimitedError):
        limiter.reserve(principal(rpm=1, key_id="alice"), 0)
    limiter.reserve(principal(rpm=1, key_id="bob"), 0)
    free = principal(key_id="carol")
    for _ in range(1000):
        assert limiter.reserve(free, 10**9).headers == {}


def test_new_limits_for_a_key_start_a_new_bucket():
    limiter = RateLimiter(FakeClock())
    limiter.reserve(principal(rpm=1), 0)
    with pytest.raises(RateLimitedError):
        limiter.reserve(principal(rpm=1), 0)
    limiter.reserve(principal(rpm=2), 0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-1, "0s"),
        (0.0171, "18ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (12.0004, "12.001s"),
        (59.9, "59.9s"),
        (60, "1m0s"),
        (360, "6m0s"),
        (61.2, "1m2s"),
        (3600, "1h0m0s"),
    ],
)
def test_reset_durations_are_written_as_openai_does(seconds, text):
    assert format_reset(seconds) == text


def test_chat_token_estimate_counts_input_and_the_completion_asked_for():
    texts = ["abcdefgh", "abc"]  # 2 + 1 tokens at 4 characters per token, 4 per message
    assert estimate_chat_tokens(texts, 50, default_max_tokens=256) == 3 + 8 + 50
    assert estimate_chat_tokens(texts, None, default_max_tokens=256) == 3 + 8 + 256


# ---- request limits -------------------------------------------------------------------------


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "glm", "messages": [{"role": "user", "content": "hi"}], **fields}
    return ChatCompletionRequest.model_validate(body)


LIMITS = RequestLimits(
    max_messages=3,
    max_input_chars=20,
    max_completion_tokens=100,
    max_batch_items=2,
    max_item_chars=5,
    temperature=ParamRange(min=0.0, max=1.0),
    top_p=ParamRange(min=0.5, max=1.0),
)


def test_a_request_within_every_limit_passes():
    messages = [{"role": "user", "content": "x" * 10}, {"role": "assistant", "content": "y" * 10}]
    check_chat(chat(messages=messages, max_tokens=100, temperature=1.0, top_p=0.5), LIMITS)
    check_texts(["12345", "abc"], LIMITS)


@pytest.mark.parametrize(
    ("fields", "param", "code"),
    [
        ({"messages": [{"role": "user", "content": "a"}] * 4}, "messages", "too_many_messages"),
        ({"messages": [{"role": "user", "content": "a" * 21}]}, "messages", "input_too_long"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a" * 10}] * 2}]},
            "messages",
            "input_too_long",
        ),
        ({"max_tokens": 101}, "max_tokens", "max_tokens_too_large"),
        (
            {"max_completion_tokens": 101, "max_tokens": 5},
            "max_completion_tokens",
            "max_tokens_too_large",
        ),
        ({"temperature": 1.5}, "temperature", "parameter_out_of_range"),
        ({"top_p": 0.4}, "top_p", "parameter_out_of_range"),
    ],
)
def test_each_chat_limit_names_itself(fields, param, code):
    with pytest.raises(InvalidRequestError) as caught:
        check_chat(chat(**fields), LIMITS)
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, param, code)


def test_text_parts_joined_count_their_separator_too():
    # Two 10-character parts become 21 characters (joined by a newline): over a limit of 20.
    parts = [{"type": "text", "text": "a" * 10}] * 2
    with pytest.raises(InvalidRequestError, match="21 characters"):
        check_chat(chat(messages=[{"role": "user", "content": parts}]), LIMITS)


@pytest.mark.parametrize(
    ("texts", "param", "code"),
    [
        (["a", "b", "c"], "input", "too_many_inputs"),
        (["123456"], "input", "input_too_long"),
        (["ok", "123456"], "input.1", "input_too_long"),
        (["ok", "bad \ud800"], "input.1", "invalid_utf8"),
    ],
)
def test_each_batch_limit_names_itself(texts, param, code):
    with pytest.raises(InvalidRequestError) as caught:
        check_texts(texts, LIMITS)
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, param, code)


def test_invalid_utf8_in_chat_is_refused_even_past_the_protocol():
    request = chat()
    request.messages[0].content = "lone \udc80 surrogate"  # as if built without validation
    with pytest.raises(InvalidUTF8Error) as caught:
        check_chat(request, LIMITS)
    assert caught.value.param == "messages.0.content"


def test_security_config_refuses_unknown_fields_and_bad_ranges():
    with pytest.raises(ValidationError):
        SecurityConfig.model_validate({"default_limit": {}})
    with pytest.raises(ValidationError):
        RequestLimits.model_validate({"temperature": {"min": 1.5, "max": 1.0}})
    with pytest.raises(ValidationError):
        ModerationGateConfig(window_chars=10, overlap_chars=10)
    with pytest.raises(ValidationError):
        RateLimits(requests_per_minute=0)


# ---- moderation gate ------------------------------------------------------------------------

MARKER = "BAD"


class FakeModeration:
    """Flags any text containing the marker word; records every call."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    async def __call__(self, texts: list[str]) -> list[bool]:
        self.calls.append(list(texts))
        return [MARKER in text for text in texts]


def gate_for(
    window: int = 10, overlap: int = 4, **fields: Any
) -> tuple[ModerationGate, FakeModeration]:
    classify = FakeModeration()
    config = ModerationGateConfig(
        models=["glm"], window_chars=window, overlap_chars=overlap, **fields
    )
    return ModerationGate(config, classify), classify


class Generation:
    """A model's stream of `text` in seeded random pieces; knows how far it was consumed."""

    def __init__(self, text: str, seed: int = 0, finish: str = "stop") -> None:
        rng = random.Random(seed)
        self.pieces: list[str] = []
        start = 0
        while start < len(text):
            size = rng.randint(0, 7)
            self.pieces.append(text[start : start + size])
            start += size
        self.finish = finish
        self.produced = 0
        self.closed = False

    async def chunks(self) -> AsyncIterator[GenerationChunk]:
        try:
            for index, piece in enumerate(self.pieces):
                self.produced += 1
                last = index == len(self.pieces) - 1
                yield GenerationChunk(piece, self.finish if last else None, 7, index + 1)  # type: ignore[arg-type]
        finally:
            self.closed = True


def run_stream(gate: ModerationGate, generation: Generation) -> list[GenerationChunk]:
    async def collect() -> list[GenerationChunk]:
        return [chunk async for chunk in gate.guard_stream(generation.chunks())]

    return asyncio.run(collect())


def test_applies_only_to_configured_models():
    gate, _ = gate_for()
    assert gate.applies_to("glm") and not gate.applies_to("kimi")


def test_flagged_input_is_refused_before_generation():
    gate, classify = gate_for()
    messages = [
        {"role": "system", "content": "be nice"},
        {"role": "assistant", "content": None},
        {"role": "user", "content": f"say {MARKER} things"},
    ]
    with pytest.raises(ContentPolicyViolationError) as caught:
        asyncio.run(gate.check_input(messages))
    error = caught.value
    assert (error.status, error.code, error.param) == (
        400,
        "content_policy_violation",
        "messages.2.content",
    )
    assert classify.calls == [["be nice", f"say {MARKER} things"]]  # one call, empty skipped
    asyncio.run(gate.check_input([{"role": "user", "content": "fine"}]))


def test_input_check_can_be_turned_off():
    gate, classify = gate_for(check_input=False)
    asyncio.run(gate.check_input([{"role": "user", "content": MARKER}]))
    assert classify.calls == []


def test_clean_output_passes_unchanged():
    gate, classify = gate_for()
    text = "a perfectly fine answer of some length"
    assert asyncio.run(gate.filter_output(text, "length")) == (text, "length")
    assert len(classify.calls) == 1 and len(classify.calls[0]) == 4  # ceil(38 / 10) windows


def test_flagged_output_is_replaced_by_the_refusal():
    gate, _ = gate_for(refusal_text="No.")
    text = "fine words " * 5 + MARKER + " and more"
    assert asyncio.run(gate.filter_output(text, "stop")) == ("No.", "content_filter")


def test_a_marker_cut_by_a_window_boundary_is_caught_by_the_overlap():
    text = "x" * 9 + MARKER + "y" * 8  # the marker spans the first two windows of 10
    caught, _ = gate_for(window=10, overlap=4)
    assert asyncio.run(caught.filter_output(text, "stop"))[1] == "content_filter"
    missed, _ = gate_for(window=10, overlap=0)
    assert asyncio.run(missed.filter_output(text, "stop"))[1] == "stop"


def words_text(length: int, seed: int) -> str:
    """Filler of short lowercase words (at most 5 letters) and single spaces or punctuation."""
    rng = random.Random(seed)
    out = ""
    while len(out) < length:
        out += "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 5)))
        out += rng.choice("  ,.")
    return out[:length]


def released_while_checking(
    gate: ModerationGate, classify: FakeModeration, generation: Generation
) -> list[GenerationChunk]:
    """The stream's chunks; each released text was the tail of the last classified text when
    it came out (nothing is released before it is checked)."""

    async def collect() -> list[GenerationChunk]:
        chunks = []
        async for chunk in gate.guard_stream(generation.chunks()):
            if chunk.text:  # checked last, maybe with the unspaced character held after it
                last = classify.calls[-1][0] if classify.calls else ""
                ahead = held_unspaced(last[-1:])
                assert last.endswith(chunk.text) or last.removesuffix(ahead).endswith(chunk.text)
            chunks.append(chunk)
        return chunks

    return asyncio.run(collect())


def test_a_stream_is_released_up_to_its_last_word_boundary_per_chunk():
    gate, classify = gate_for(window=10, overlap=4)
    generation = Generation("")
    generation.pieces = ["Hel", "lo wo", "rld. ", "", "fin", "e"]
    chunks = released_while_checking(gate, classify, generation)
    # "Hel" and "wo" wait for the rest of their word; a boundary releases all before it.
    assert [c.text for c in chunks] == ["Hello ", "world. ", "fine"]
    assert [c.finish_reason for c in chunks] == [None, None, "stop"]
    assert [c.completion_tokens for c in chunks] == [2, 3, 6]
    assert generation.closed


def test_a_run_without_a_boundary_is_released_once_it_reaches_the_window():
    gate, classify = gate_for(window=10, overlap=4)
    generation = Generation("")
    generation.pieces = ["abcdef", "ghijkl", "mn", " x", "y"]
    chunks = released_while_checking(gate, classify, generation)
    assert [c.text for c in chunks] == ["abcdefghijkl", "mn ", "xy"]


@pytest.mark.parametrize(
    ("text", "releasable"),
    [
        ("hello wor", "hello "),
        ("你好世界", "你好世"),  # every character ends a word; the last waits for its neighbour
        ("こんにちは", "こんにち"),
        ("Cust光Cust", "Cust光"),  # a Latin run ends where an ideograph starts, and goes on after
        ("你好abc", "你好"),
        ("光", ""),
        ("你好，", "你好，"),
        ("안녕하세요 친구", "안녕하세요 "),  # Hangul is written with spaces: held like Latin
    ],
)
def test_unspaced_scripts_end_a_word_at_every_character(text, releasable):
    assert text[: releasable_length(text, 64)] == releasable


def test_a_chinese_stream_flows_a_character_behind_and_a_two_character_word_is_judged_whole():
    gate, classify = gate_for(window=64, overlap=8)
    generation = Generation("")
    generation.pieces = ["我是", "一个", "好人", "。"]
    clean = released_while_checking(gate, classify, generation)
    assert [c.text for c in clean] == ["我", "是一", "个好", "人。"]  # not "我是一个好人。" at once
    assert classify.calls[0] == ["我是"]  # the held character judged with the one before it
    gate, classify = gate_for(window=64, overlap=8)
    generation = Generation("")
    generation.pieces = ["他是", "一个", "B", "AD", "人"]  # the marker, cut in two
    cut = released_while_checking(gate, classify, generation)
    assert "".join(c.text for c in cut) == "他是一个"
    assert cut[-1].finish_reason == "content_filter"

    async def flags_the_pair(texts: list[str]) -> list[bool]:
        return ["坏蛋" in text for text in texts]  # either character alone passes

    gate = ModerationGate(ModerationGateConfig(models=["glm"], window_chars=64), flags_the_pair)
    for pieces in (["坏", "蛋"], ["这是坏", "蛋"], ["这是", "坏蛋"], ["这是坏蛋", "的人"]):
        generation = Generation("")
        generation.pieces = pieces
        judged = asyncio.run(_collect(gate.guard_stream(generation.chunks())))
        assert "坏" not in "".join(c.text for c in judged), pieces
        assert judged[-1].finish_reason == "content_filter"


async def _collect(chunks: AsyncIterator[GenerationChunk]) -> list[GenerationChunk]:
    return [chunk async for chunk in chunks]


@pytest.mark.parametrize("seed", range(8))
def test_a_clean_stream_loses_nothing_and_cuts_no_word(seed):
    window = 16
    gate, classify = gate_for(window=window, overlap=4)
    text = words_text(120, seed)
    generation = Generation(text, seed=seed)
    chunks = released_while_checking(gate, classify, generation)
    assert "".join(chunk.text for chunk in chunks) == text
    for chunk in chunks[:-1]:  # words are at most 5 letters: no run reaches the window
        assert chunk.text and not chunk.text[-1].isalnum()
    assert [chunk.finish_reason for chunk in chunks] == [None] * (len(chunks) - 1) + ["stop"]
    assert chunks[-1].completion_tokens == len(generation.pieces)
    assert generation.closed


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("marker_at", [0, 3, 10, 17, 26, 48])
def test_a_flagged_word_is_never_released_and_nothing_before_it_is_lost(seed, marker_at):
    window = 16
    gate, classify = gate_for(window=window, overlap=4)
    filler = words_text(60, seed)
    text = filler[:marker_at] + MARKER + filler[marker_at:]
    generation = Generation(text, seed=seed)
    chunks = released_while_checking(gate, classify, generation)
    released = "".join(chunk.text for chunk in chunks)
    assert text.startswith(released) and MARKER not in released
    # Nothing of the marker's word comes out: the release stops at the boundary before it ...
    word_start = marker_at
    while word_start and text[word_start - 1].isalnum():
        word_start -= 1
    assert len(released) <= word_start
    # ... and all whole words before the chunk that completed the marker did come out.
    completed_by, end = 0, 0
    while end < marker_at + len(MARKER):
        end += len(generation.pieces[completed_by])
        completed_by += 1
    before = text[: end - len(generation.pieces[completed_by - 1])]
    assert len(released) >= releasable_length(before, window)
    assert chunks[-1].finish_reason == "content_filter" and chunks[-1].text == ""
    assert all(chunk.finish_reason is None for chunk in chunks[:-1])
    assert generation.closed
    assert generation.produced <= len(generation.pieces)


def test_a_flagged_word_cut_between_chunks_is_classified_whole_without_overlap():
    gate, classify = gate_for(window=10, overlap=0)
    generation = Generation("")
    generation.pieces = ["fine. you B", "A", "D fool", "s"]
    chunks = released_while_checking(gate, classify, generation)
    assert [c.text for c in chunks] == ["fine. you ", ""]
    assert chunks[-1].finish_reason == "content_filter"
    assert [call[0] for call in classify.calls] == ["fine. you ", "BAD "]


def test_the_stream_stops_consuming_the_model_at_the_flagged_window():
    gate, _ = gate_for(window=10)
    text = MARKER + "z" * 200
    generation = Generation(text, seed=3)
    chunks = run_stream(gate, generation)
    assert [c.finish_reason for c in chunks] == ["content_filter"]
    assert generation.produced < len(generation.pieces) and generation.closed


def test_a_flagged_last_word_is_filtered_at_the_end():
    gate, classify = gate_for(window=10)
    generation = Generation("")
    generation.pieces = ["q" * 12, "q" * 8 + " o", "k ", MARKER]
    chunks = released_while_checking(gate, classify, generation)
    assert [c.text for c in chunks] == ["q" * 12, "q" * 8 + " ", "ok ", ""]
    assert chunks[-1].finish_reason == "content_filter"


def test_streamed_and_whole_answers_get_the_same_verdict():
    verdicts = set()
    for seed in range(30):
        rng = random.Random(seed)
        text = "".join(rng.choice("ABD") for _ in range(14))  # "BAD" in about a third of them
        gate, _ = gate_for(window=4, overlap=2)
        _, finish = asyncio.run(gate.filter_output(text, "stop"))
        chunks = run_stream(gate, Generation(text, seed=seed))
        assert (
            chunks[-1].finish_reason == finish == ("content_filter" if MARKER in text else "stop")
        )
        verdicts.add(finish)
    assert verdicts == {"stop", "content_filter"}


def test_output_checks_can_be_turned_off():
    gate, classify = gate_for(check_output=False)
    generation = Generation(f"x {MARKER} y", seed=0)
    chunks = run_stream(gate, generation)
    assert [c.text for c in chunks] == generation.pieces
    assert asyncio.run(gate.filter_output(MARKER, "stop")) == (MARKER, "stop")
    assert classify.calls == []


def test_an_empty_stream_yields_nothing_and_errors_propagate():
    gate, _ = gate_for()
    assert run_stream(gate, Generation("")) == []

    async def failing() -> AsyncIterator[GenerationChunk]:
        yield GenerationChunk("abc", None, 1, 1)
        raise RuntimeError("replica died")

    async def collect() -> list[GenerationChunk]:
        return [chunk async for chunk in gate.guard_stream(failing())]

    with pytest.raises(RuntimeError, match="replica died"):
        asyncio.run(collect())


def test_a_metered_stream_settles_to_its_last_usage_however_it_ends():
    clock = FakeClock()
    limiter, who = RateLimiter(clock), principal(tpm=600)

    async def take(count: int) -> list[GenerationChunk]:
        reservation = limiter.reserve(who, 500)
        stream = metered_stream(
            Generation("abcdefghijklmnopqrstuvwxyz", seed=5).chunks(), reservation
        )
        taken = []
        async for chunk in stream:
            taken.append(chunk)
            if len(taken) == count:
                break
        await stream.aclose()  # what the server does when a client leaves
        return taken

    whole = asyncio.run(take(-1))
    used = whole[-1].prompt_tokens + whole[-1].completion_tokens
    assert limiter.headers(who)["x-ratelimit-remaining-tokens"] == str(600 - used)
    clock.advance(60)
    part = asyncio.run(take(2))
    used = part[-1].prompt_tokens + part[-1].completion_tokens
    assert used < 500
    assert limiter.headers(who)["x-ratelimit-remaining-tokens"] == str(600 - used)
