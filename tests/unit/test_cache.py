"""ResponseCache keys, TTL and size bound (injected clock), and the bypass headers."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers

from deployments.cache import ResponseCache, wants_bypass
from deployments.config import CacheConfig
from deployments.protocol import ChatCompletionRequest, EmbeddingRequest
from edge_sim.clock import ManualClock

KEY_ALICE = "Bearer sk-alice"


def embedding(**fields: object) -> EmbeddingRequest:
    return EmbeddingRequest.model_validate({"model": "embedding", "input": ["a", "b"], **fields})


def key(request: object, credentials: str | None = KEY_ALICE, endpoint: str = "embeddings") -> str:
    return ResponseCache.key(endpoint, request, credentials)  # type: ignore[arg-type]


# ---- keys --------------------------------------------------------------------------------------


def test_field_order_does_not_change_the_key():
    one = EmbeddingRequest.model_validate(
        {"model": "embedding", "input": ["a", "b"], "encoding_format": "base64", "dimensions": 4}
    )
    other = EmbeddingRequest.model_validate(
        {"dimensions": 4, "encoding_format": "base64", "input": ["a", "b"], "model": "embedding"}
    )
    assert key(one) == key(other)


def test_chat_messages_in_a_different_field_order_give_the_same_key():
    one = ChatCompletionRequest.model_validate(
        {"model": "glm", "temperature": 0, "messages": [{"role": "user", "content": "hi"}]}
    )
    other = ChatCompletionRequest.model_validate(
        {"messages": [{"content": "hi", "role": "user"}], "temperature": 0, "model": "glm"}
    )
    assert key(one, endpoint="chat") == key(other, endpoint="chat")


def test_ignored_and_null_fields_do_not_change_the_key():
    plain = embedding()
    assert key(embedding(user="someone")) == key(plain)  # `user` is only a label
    assert key(embedding(logit_bias={"1": 2})) == key(plain)  # unknown: accepted and ignored
    assert key(embedding(dimensions=None)) == key(plain)  # null means "not given"


@pytest.mark.parametrize(
    "changed",
    [
        {"input": ["a", "c"]},
        {"input": ["b", "a"]},
        {"model": "embedding-2"},
        {"encoding_format": "base64"},
        {"dimensions": 8},
    ],
)
def test_anything_that_changes_the_answer_changes_the_key(changed: dict[str, object]):
    assert key(embedding(**changed)) != key(embedding())


def test_different_credentials_never_share_a_key():
    request = embedding()
    keys = {
        key(request, KEY_ALICE),
        key(request, "Bearer sk-bob"),
        key(request, None),
    }
    assert len(keys) == 3
    assert key(request, KEY_ALICE) == key(embedding(), KEY_ALICE)


def test_the_key_does_not_carry_the_credentials_in_clear():
    secret = "sk-very-secret-value"
    assert secret not in key(embedding(), f"Bearer {secret}")


def test_the_endpoint_is_part_of_the_key():
    assert key(embedding(), endpoint="embeddings") != key(embedding(), endpoint="moderations")


# ---- storage -----------------------------------------------------------------------------------


def test_an_entry_expires_after_its_ttl():
    clock = ManualClock()
    cache = ResponseCache(CacheConfig(ttl_s=10.0), clock=clock)
    cache.put("k", {"answer": 1})
    assert cache.get("k") == {"answer": 1}
    clock.advance(9.0)
    assert cache.get("k") == {"answer": 1}
    clock.advance(2.0)
    assert cache.get("k") is None
    assert len(cache) == 0


def test_a_new_put_restarts_the_ttl():
    clock = ManualClock()
    cache = ResponseCache(CacheConfig(ttl_s=10.0), clock=clock)
    cache.put("k", "old")
    clock.advance(8.0)
    cache.put("k", "new")
    clock.advance(8.0)
    assert cache.get("k") == "new"


def test_the_cache_holds_at_most_max_entries():
    cache = ResponseCache(CacheConfig(max_entries=2), clock=ManualClock())
    for index in range(5):
        cache.put(f"k{index}", index)
        assert len(cache) <= 2
    assert len(cache) == 2
    assert cache.get("k4") == 4 and cache.get("k3") == 3
    assert cache.get("k0") is None


def test_a_disabled_cache_never_stores():
    cache = ResponseCache(CacheConfig(enabled=False), clock=ManualClock())
    cache.put("k", "value")
    assert cache.get("k") is None
    assert len(cache) == 0


def test_a_miss_is_none():
    assert ResponseCache(CacheConfig(), clock=ManualClock()).get("nothing") is None


# ---- bypass ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "headers",
    [
        {"x-edge-cache": "bypass"},
        {"x-edge-cache": "BYPASS"},
        {"cache-control": "no-cache"},
        {"cache-control": "no-store"},
        {"cache-control": "No-Store"},
        {"cache-control": "max-age=0, no-cache"},
        {"cache-control": "private,no-store"},
    ],
)
def test_bypass_headers(headers: dict[str, str]):
    assert wants_bypass(headers)
    assert wants_bypass(Headers(headers))


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"x-edge-cache": ""},
        {"x-edge-cache": "hit"},
        {"x-edge-cache": "bypassed"},
        {"cache-control": "max-age=60"},
        {"cache-control": "private, must-revalidate"},
        {"cache-control": "no-transform"},
        {"pragma": "no-cache"},
    ],
)
def test_no_bypass_for_other_headers(headers: dict[str, str]):
    assert not wants_bypass(headers)
    assert not wants_bypass(Headers(headers))


def test_bypass_header_names_are_case_insensitive_on_real_request_headers():
    assert wants_bypass(Headers({"X-Edge-Cache": "bypass"}))
    assert wants_bypass(Headers({"Cache-Control": "no-cache"}))
