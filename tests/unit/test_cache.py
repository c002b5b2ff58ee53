"""The response cache: keys and bypass headers; the in-process tier (TTL and size, injected
clock); answers round-tripping exactly through bytes; both shared backends (SQLite in a temp dir,
Redis of the test's own) seen by two router replicas; and a backend that fails, stalls or dies is
a miss, counted, never an error, and is used again once it answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis import Redis
from starlette.datastructures import Headers

from benchmarks.lib.fake_handles import app_config
from deployments.config import CacheConfig, ConfigError
from deployments.ingress.cache import (
    REDIS_PASSWORD_ENV,
    REDIS_URL_ENV,
    ResponseCache,
    SharedStore,
    StoreUnavailable,
    cache_key,
    open_cache_store,
    wants_bypass,
)
from deployments.ingress.cache.codec import CodecError, decode_answer, encode_answer
from deployments.ingress.cache.redis_store import RedisStore
from deployments.ingress.cache.response_cache import ENVELOPE, MAX_STORE_CALLS_IN_FLIGHT
from deployments.ingress.cache.sqlite_store import SQLiteStore
from deployments.ingress.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    EmbeddingRequest,
    ModerationCreateResponse,
)
from deployments.ingress.protocol.embeddings import EmbeddingList
from deployments.ingress.protocol.moderations import Moderation
from edge_sim.clock import ManualClock
from edgectl.local_cluster import wait_until
from edgectl.local_services import RedisServer
from tests.waiting import until

KEY_ALICE = "Bearer sk-alice"


def embedding(**fields: object) -> EmbeddingRequest:
    return EmbeddingRequest.model_validate({"model": "embedding", "input": ["a", "b"], **fields})


def key(request: object, credentials: str | None = KEY_ALICE, endpoint: str = "embeddings") -> str:
    return cache_key(endpoint, request, credentials)  # type: ignore[arg-type]


def run(coroutine: Awaitable[Any]) -> Any:
    return asyncio.run(coroutine)  # type: ignore[arg-type]


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


# ---- answers as bytes --------------------------------------------------------------------------


def embeddings(encoding_format: str = "float", rows: int = 2) -> EmbeddingList:
    vectors = np.random.default_rng(7).standard_normal((rows, 384)).astype(np.float32)
    return EmbeddingList(vectors, "embedding", 11, encoding_format)  # type: ignore[arg-type]


def chat_completion(text: str = 'Hello, \u4e16\u754c! "quoted" \\ and more') -> ChatCompletion:
    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "created": 1_700_000_000,
            "model": "glm",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14},
        }
    )


def moderation() -> ModerationCreateResponse:
    verdict = Moderation.from_scores(
        {"harassment": 0.1 + 0.2, "profanity": 1e-300}, {"harassment": False, "profanity": False}
    )
    return ModerationCreateResponse(id="modr-1", model="moderation", results=[verdict])


def same_answer(one: Any, other: Any) -> bool:
    if isinstance(one, EmbeddingList):
        return (
            isinstance(other, EmbeddingList)
            and other.vectors.dtype == one.vectors.dtype
            and other.vectors.tobytes() == one.vectors.tobytes()  # bit for bit, NaN included
            and (other.model, other.prompt_tokens, other.encoding_format)
            == (one.model, one.prompt_tokens, one.encoding_format)
        )
    return type(other) is type(one) and other.model_dump_json() == one.model_dump_json()


ANSWERS = {
    "embeddings": embeddings(),
    "embeddings-base64": embeddings("base64", rows=3),
    "chat": chat_completion(),
    "moderation": moderation(),
}


@pytest.mark.parametrize("name", ANSWERS)
def test_every_cached_answer_type_round_trips_exactly(name: str):
    answer = ANSWERS[name]
    assert same_answer(answer, decode_answer(encode_answer(answer)))


def test_an_embedding_row_keeps_every_bit_including_nan_and_negative_zero():
    vectors = np.array([[np.nan, -0.0, np.inf, 1e-45]], dtype=np.float32)
    answer = EmbeddingList(vectors, "embedding", 1)
    assert decode_answer(encode_answer(answer)).vectors.tobytes() == vectors.tobytes()


def test_a_decoded_answer_cannot_be_changed_by_whoever_it_is_served_to():
    again = decode_answer(encode_answer(embeddings()))
    with pytest.raises(ValueError):
        again.vectors[0, 0] = 1.0


def test_the_encoding_is_compact():
    """An embedding costs its float32 bytes and a small header; a chat answer its JSON."""
    answer = embeddings(rows=1)
    assert len(encode_answer(answer)) < answer.vectors.nbytes + 128
    completion = chat_completion()
    assert len(encode_answer(completion)) == len(completion.model_dump_json().encode()) + 1


@pytest.mark.parametrize(
    "data",
    [b"", b"Z{}", b"C{not json", b"M{}", b"E\x00", b"E\xff\x00\x00\x00{}"],
    ids=["empty", "unknown-tag", "bad-json", "wrong-shape", "short-header", "header-too-long"],
)
def test_bytes_that_are_no_answer_are_a_codec_error(data: bytes):
    with pytest.raises(CodecError):
        decode_answer(data)


def test_an_answer_of_another_type_is_refused_when_stored():
    with pytest.raises(TypeError, match="no cache encoding for dict"):
        encode_answer({"answer": 1})


# ---- the in-process cache (backend: memory) ----------------------------------------------------


def memory_cache(clock: ManualClock, **config: Any) -> ResponseCache:
    return ResponseCache(CacheConfig(backend="memory", **config), clock=clock)


def test_an_entry_expires_after_its_ttl():
    clock = ManualClock(1000.0)
    cache = memory_cache(clock, ttl_s=10.0)
    answer = chat_completion()
    run(cache.put("k", answer))
    assert run(cache.get("k")) == answer
    clock.advance(9.0)
    assert run(cache.get("k")) == answer
    clock.advance(2.0)
    assert run(cache.get("k")) is None


def test_a_new_put_restarts_the_ttl():
    clock = ManualClock(1000.0)
    cache = memory_cache(clock, ttl_s=10.0)
    run(cache.put("k", chat_completion("old")))
    clock.advance(8.0)
    run(cache.put("k", chat_completion("new")))
    clock.advance(8.0)
    assert run(cache.get("k")) == chat_completion("new")


def test_the_memory_backend_holds_at_most_max_entries():
    cache = memory_cache(ManualClock(1000.0), max_entries=2)
    for index in range(5):
        run(cache.put(f"k{index}", chat_completion(str(index))))
    assert run(cache.get("k4")) == chat_completion("4")
    assert run(cache.get("k3")) == chat_completion("3")
    assert run(cache.get("k0")) is None


def test_a_disabled_cache_never_stores_nor_asks_its_store():
    store = RecordingStore()
    cache = ResponseCache(CacheConfig(enabled=False), store, clock=ManualClock(1000.0))
    run(cache.put("k", chat_completion()))
    assert run(cache.get("k")) is None
    assert store.calls == []


def test_a_miss_is_none():
    assert run(memory_cache(ManualClock()).get("nothing")) is None


# ---- the tiers, on a store of the test's own ---------------------------------------------------


class RecordingStore:
    """A dict with expiries on an injected clock, recording each call; `fail` makes every call
    raise, `stall` makes every call wait until released."""

    name = "fake"

    def __init__(self, clock: Callable[[], float] = lambda: 0.0):
        self.entries: dict[str, tuple[bytes, float]] = {}
        self.calls: list[str] = []
        self.clock = clock
        self.fail = False
        self.stall: asyncio.Event | None = None

    async def _enter(self, call: str) -> None:
        self.calls.append(call)
        if self.stall is not None:
            await self.stall.wait()
        if self.fail:
            raise StoreUnavailable("fake: down")

    async def get(self, key: str) -> bytes | None:
        await self._enter("get")
        value, expires_at = self.entries.get(key, (b"", 0.0))
        return value if expires_at > self.clock() else None

    async def put(self, key: str, value: bytes, ttl_s: float, release_token: str = "") -> None:
        await self._enter("put")
        self.entries[key] = (value, self.clock() + ttl_s)

    async def close(self) -> None:
        pass


class Failures:
    def __init__(self) -> None:
        self.counted: list[tuple[str, str, str]] = []

    def __call__(self, backend: str, operation: str, reason: str) -> None:
        self.counted.append((backend, operation, reason))


def tiered(store: SharedStore, clock: ManualClock, failures: Failures | None = None, **config: Any):
    # A bound far above what a loaded machine takes, unless a test is about the bound.
    settings = CacheConfig(**{"timeout_ms": 10_000, **config})
    return ResponseCache(settings, store, clock=clock, on_failure=failures)


def test_a_local_hit_does_not_ask_the_store_and_a_store_hit_is_kept_locally():
    clock = ManualClock(1000.0)
    store = RecordingStore(clock)
    writer, reader = tiered(store, clock), tiered(store, clock)  # two router replicas
    run(writer.put("k", chat_completion()))
    assert store.calls == ["put"]
    assert run(writer.get("k")) == chat_completion()  # its own answer, from its local tier
    assert store.calls == ["put"]
    assert run(reader.get("k")) == chat_completion()  # the other replica's, from the store
    assert run(reader.get("k")) == chat_completion()  # then from its own local tier
    assert store.calls == ["put", "get"]


def test_without_a_local_tier_every_lookup_asks_the_store():
    clock = ManualClock(1000.0)
    store = RecordingStore(clock)
    cache = tiered(store, clock, local_entries=0)
    run(cache.put("k", chat_completion()))
    assert [run(cache.get("k")) for _ in range(3)] == [chat_completion()] * 3
    assert store.calls == ["put", "get", "get", "get"]


def test_a_local_copy_lives_no_longer_than_the_entry_it_copies():
    clock = ManualClock(1000.0)
    store = RecordingStore(clock)
    writer, reader = tiered(store, clock, ttl_s=10.0), tiered(store, clock, ttl_s=10.0)
    run(writer.put("k", chat_completion()))
    clock.advance(8.0)
    assert run(reader.get("k")) == chat_completion()  # copied 2 s before the entry expires
    clock.advance(2.5)
    assert run(reader.get("k")) is None
    assert run(writer.get("k")) is None


def test_an_entry_past_its_expiry_is_a_miss_even_if_a_store_returns_it():
    """A store on another clock (Redis's PX) may hand back what our clock says is expired."""
    clock = ManualClock(1000.0)
    store = RecordingStore(lambda: 0.0)  # never expires anything
    run(tiered(store, clock, ttl_s=10.0).put("k", chat_completion()))
    clock.advance(11.0)
    assert run(tiered(store, clock).get("k")) is None


def test_a_store_that_fails_is_a_miss_counted_then_left_alone_then_asked_again(caplog):
    clock = ManualClock(1000.0)
    store, failures = RecordingStore(clock), Failures()
    cache = tiered(store, clock, failures, local_entries=0, retry_after_s=5.0)
    run(cache.put("k", chat_completion()))
    store.fail = True
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        assert run(cache.get("k")) is None
        run(cache.put("j", chat_completion()))  # never raises
        clock.advance(4.9)
        assert run(cache.get("k")) is None
        assert store.calls == ["put", "get"]  # not asked while it is down
        assert failures.counted == [
            ("fake", "get", "error"),
            ("fake", "put", "down"),
            ("fake", "get", "down"),
        ]
        store.fail = False
        clock.advance(0.2)
        assert run(cache.get("k")) == chat_completion()  # asked again: it is back
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2, messages  # one line when it fails, one when it is back
    assert "fake backend failed (get: fake: down)" in messages[0]
    assert "answers again" in messages[1]


def test_a_stalled_store_is_a_miss_after_the_timeout():
    async def scenario() -> tuple[Any, list[tuple[str, str, str]]]:
        clock = ManualClock(1000.0)
        store, failures = RecordingStore(clock), Failures()
        store.stall = asyncio.Event()  # never set: the store never answers
        cache = tiered(store, clock, failures, local_entries=0, timeout_ms=20)
        return await cache.get("k"), failures.counted

    assert run(scenario()) == (None, [("fake", "get", "timeout")])


def test_a_stalled_store_holds_a_bounded_number_of_requests():
    async def scenario() -> list[tuple[str, str, str]]:
        clock = ManualClock(1000.0)
        store, failures = RecordingStore(clock), Failures()
        store.stall = asyncio.Event()
        cache = tiered(store, clock, failures, local_entries=0, timeout_ms=10_000)
        waiting = [
            asyncio.create_task(cache.get(f"k{i}")) for i in range(MAX_STORE_CALLS_IN_FLIGHT)
        ]
        await asyncio.sleep(0)  # every one of them is now waiting on the store
        assert await cache.get("one more") is None  # at once, without asking
        store.stall.set()
        assert await asyncio.gather(*waiting) == [None] * MAX_STORE_CALLS_IN_FLIGHT
        return failures.counted

    assert run(scenario()) == [("fake", "get", "busy")]


def test_an_entry_that_does_not_decode_is_a_miss_counted():
    clock = ManualClock(1000.0)
    store, failures = RecordingStore(clock), Failures()
    store.entries["k"] = (ENVELOPE.pack(2000.0) + b"C{broken", 2000.0)
    store.entries["short"] = (b"\x01", 2000.0)
    cache = tiered(store, clock, failures)
    assert run(cache.get("k")) is None and run(cache.get("short")) is None
    assert failures.counted == [("fake", "get", "corrupt")] * 2


def test_an_entry_that_does_not_decode_is_made_again_by_a_lead_that_claims_it(tmp_path: Path):
    """get_or_claim found an entry it cannot use: a miss counted, and the lead takes the mark."""
    clock = ManualClock(1000.0)
    store, failures = SQLiteStore(tmp_path / "cache.sqlite3", 100, 10_000, clock=clock), Failures()
    cache = tiered(store, clock, failures)

    async def scenario() -> tuple[Any, bool | None]:
        try:
            await store.put("k", ENVELOPE.pack(2000.0) + b"C{broken", 60)
            return await cache.get_or_claim("k", "lead", 60)
        finally:
            await store.close()

    assert asyncio.run(scenario()) == (None, True)
    assert failures.counted == [("sqlite", "lookup", "corrupt")]


# ---- the shared backends: two router replicas, each with its own connection -------------------


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., SharedStore]]:
    """Makes a new store on one backend (as each router replica opens its own)."""
    if request.param == "sqlite":
        path = tmp_path / "data" / "response-cache.sqlite3"
        yield lambda max_entries=100, **kw: SQLiteStore(path, max_entries, 10_000, **kw)
        return
    redis: RedisServer = request.getfixturevalue("redis_server")
    yield lambda max_entries=100: RedisStore(
        redis.url, password=None, key_prefix="test:", max_entries=max_entries, timeout_ms=10_000
    )


def replica(store: SharedStore, **config: Any) -> ResponseCache:
    return ResponseCache(CacheConfig(timeout_ms=10_000, **config), store)


@pytest.mark.parametrize("name", ANSWERS)
def test_an_answer_stored_by_one_replica_is_a_hit_on_another(backend, name: str):
    async def scenario() -> Any:
        one, other = replica(backend()), replica(backend())
        try:
            assert await other.get("k") is None
            await one.put("k", ANSWERS[name])
            return await other.get("k")
        finally:
            await one.close()
            await other.close()

    assert same_answer(ANSWERS[name], run(scenario()))


def test_an_answer_outlives_the_replica_that_stored_it(backend):
    """A restarted router replica opens the backend anew and finds what was stored before."""

    async def store_then_close() -> None:
        cache = replica(backend())
        await cache.put("k", chat_completion())
        await cache.close()

    async def look_up() -> Any:
        cache = replica(backend())
        try:
            return await cache.get("k")
        finally:
            await cache.close()

    run(store_then_close())
    assert run(look_up()) == chat_completion()


def test_the_backend_keeps_at_most_max_entries_dropping_the_oldest(backend):
    async def scenario() -> list[bool]:
        cache = replica(backend(max_entries=3), local_entries=0)
        try:
            for index in range(5):
                await cache.put(f"k{index}", chat_completion(str(index)))
            return [await cache.get(f"k{index}") is not None for index in range(5)]
        finally:
            await cache.close()

    assert run(scenario()) == [False, False, True, True, True]


def test_sqlite_entries_expire_on_the_stores_clock(tmp_path: Path):
    clock = ManualClock(1000.0)
    path = tmp_path / "cache.sqlite3"

    async def scenario() -> list[Any]:
        cache = ResponseCache(
            CacheConfig(ttl_s=10.0, local_entries=0, timeout_ms=10_000),
            SQLiteStore(path, 100, 10_000, clock=clock),
            clock=clock,
        )
        try:
            await cache.put("k", chat_completion())
            found = [await cache.get("k")]
            clock.advance(10.5)
            found.append(await cache.get("k"))
            await cache.put("other", chat_completion())  # prunes what expired
            return found
        finally:
            await cache.close()

    assert run(scenario()) == [chat_completion(), None]
    import sqlite3

    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM response_cache_v1").fetchone() == (1,)


def test_redis_entries_expire_by_redis_and_leave_the_index(redis_server: RedisServer):
    """Redis expires an entry itself (PX, on its own clock); the next write drops it from the
    index, so the index counts live entries only."""
    client = Redis.from_url(redis_server.url)
    store = RedisStore(
        redis_server.url, password=None, key_prefix="t:", max_entries=10, timeout_ms=10_000
    )

    async def scenario() -> tuple[Any, Any, int]:
        cache = ResponseCache(CacheConfig(ttl_s=60, local_entries=0, timeout_ms=10_000), store)
        try:
            await cache.put("kept", chat_completion())
            await store.put("short", b"an entry of 50 ms", 0.05)
            ttl_ms = client.pttl("t:v1:kept")
            wait_until(lambda: client.exists("t:v1:short") == 0, 30, "Redis to expire it")
            await cache.put("other", chat_completion())  # drops expired ids from the index
            return await cache.get("kept"), await store.get("short"), ttl_ms
        finally:
            await cache.close()

    try:
        kept, short, ttl_ms = run(scenario())
        assert kept == chat_completion() and short is None
        assert 0 < ttl_ms <= 60_000
        assert sorted(client.zrange("t:v1:index", 0, -1)) == [b"t:v1:kept", b"t:v1:other"]
    finally:
        client.close()


def test_redis_killed_mid_run_is_misses_without_errors_and_hits_again_after_its_restart(
    redis_server: RedisServer,
):
    clock = ManualClock(1000.0)
    failures = Failures()
    store = RedisStore(
        redis_server.url, password=None, key_prefix="t:", max_entries=100, timeout_ms=10_000
    )
    cache = ResponseCache(
        CacheConfig(local_entries=0, timeout_ms=10_000, retry_after_s=1.0),
        store,
        clock=clock,
        on_failure=failures,
    )

    async def scenario() -> None:
        await cache.put("before", chat_completion())
        assert await cache.get("before") == chat_completion()
        redis_server.kill()
        assert await cache.get("before") is None
        await cache.put("during", chat_completion())
        assert ("redis", "get", "error") in failures.counted
        assert await cache.get("before") is None  # left alone while it is down...
        assert failures.counted[-1] == ("redis", "get", "down")
        redis_server.restart()

        async def hit() -> bool:  # ...then asked again: the client reconnects by itself
            clock.advance(1.0)
            await cache.put("after", chat_completion())
            return await cache.get("after") == chat_completion()

        await until(hit, 60, "a hit after Redis restarted", every_s=0.1)
        await cache.close()

    run(scenario())


def test_an_unusable_sqlite_file_is_a_miss_and_is_used_again_once_it_can_be(tmp_path: Path):
    clock = ManualClock(1000.0)
    failures = Failures()
    blocker = tmp_path / "data"
    blocker.write_text("a file where the data folder should be")
    cache = ResponseCache(
        CacheConfig(local_entries=0, timeout_ms=10_000, retry_after_s=1.0),
        SQLiteStore(blocker / "cache.sqlite3", 100, 10_000),
        clock=clock,
        on_failure=failures,
    )

    async def scenario() -> Any:
        await cache.put("k", chat_completion())
        assert await cache.get("k") is None
        blocker.unlink()
        clock.advance(1.0)
        await cache.put("k", chat_completion())
        return await cache.get("k")

    assert run(scenario()) == chat_completion()
    assert failures.counted == [("sqlite", "put", "error"), ("sqlite", "get", "down")]


# ---- which backend the config opens ------------------------------------------------------------


def cache_config(tmp_path: Path, **cache: Any):
    config = app_config(cache=cache)
    return config.model_copy(update={"data_dir": str(tmp_path)})


def test_the_default_backend_is_a_sqlite_file_under_data_dir(tmp_path: Path):
    store = open_cache_store(cache_config(tmp_path), {})
    assert isinstance(store, SQLiteStore)
    assert store.path == tmp_path / "response-cache.sqlite3"


def test_memory_and_a_disabled_cache_open_no_store(tmp_path: Path):
    assert open_cache_store(cache_config(tmp_path, backend="memory"), {}) is None
    assert open_cache_store(cache_config(tmp_path, enabled=False), {}) is None


def test_redis_takes_its_password_from_the_environment(tmp_path: Path, redis_server: RedisServer):
    config = cache_config(
        tmp_path,
        backend="redis",
        redis_url=f"redis://127.0.0.1:{redis_server.port}/0",
        local_entries=0,  # every lookup asks Redis
        timeout_ms=10_000,
    )

    async def round_trip(environ: dict[str, str]) -> Any:
        cache = ResponseCache(config.router.cache, open_cache_store(config, environ))
        try:
            await cache.put("k", chat_completion())
            return await cache.get("k")
        finally:
            await cache.close()

    assert run(round_trip({REDIS_PASSWORD_ENV: redis_server.password})) == chat_completion()
    # EDGE_REDIS_URL replaces the config's URL, password and all.
    assert run(round_trip({REDIS_URL_ENV: redis_server.url})) == chat_completion()
    # Without the password Redis refuses every call: misses, not errors.
    assert run(round_trip({})) is None


def test_redis_without_an_address_is_refused_when_the_router_starts(tmp_path: Path):
    with pytest.raises(ValueError, match=f"router.cache.redis_url or {REDIS_URL_ENV}"):
        open_cache_store(cache_config(tmp_path, backend="redis"), {})


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://:secret@redis:6379/0", "leave the password out of the URL"),
        ("redis://user:secret@redis:6379/0", "leave the password out of the URL"),
        ("http://redis:6379", "redis://, rediss:// or unix:// expected"),
    ],
)
def test_the_config_refuses_a_redis_url_with_a_password_or_another_scheme(url: str, message: str):
    with pytest.raises(ConfigError, match="args.router.cache.redis_url") as refused:
        app_config(cache={"backend": "redis", "redis_url": url})
    assert message in str(refused.value) and "secret" not in str(refused.value)


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
