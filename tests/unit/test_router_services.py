"""The router's services with fake model handles, no Ray and no HTTP: admission and settlement,
the cache, the moderation gate, failover surfaced in the trace, streams."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from router_fakes import (
    BAD_WORD,
    DIMENSION,
    FakeChatHandle,
    FakeEmbeddingHandle,
    FakeInRouterModeration,
    FakeModerationHandle,
    ScriptedChatHandle,
    app_config,
    fake_handles,
    services_for,
)

from deployments.contracts.encoder_outputs import ModerationResult
from deployments.errors import (
    ContentPolicyViolationError,
    InvalidRequestError,
    ModelNotFoundError,
    OverloadedError,
    RateLimitedError,
    WrongTaskError,
)
from deployments.ingress.cache import StoreUnavailable
from deployments.ingress.cache.sqlite_store import SQLiteStore
from deployments.ingress.protocol import ChatCompletionRequest, EmbeddingRequest, ModerationRequest
from deployments.ingress.security import Principal, RateLimits
from deployments.ingress.serving.context import RequestContext
from deployments.ingress.serving.services import RouterServices
from deployments.observability import (
    InMemoryMetricsBackend,
    RouterObservability,
    configure_access_logger,
)

TOKENS_PER_MINUTE = 10_000
LIMITED = Principal("alice", RateLimits(requests_per_minute=100, tokens_per_minute=10_000))
LONDON = {"x-client-geo": "51.5,-0.12"}


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def run_settled(services: RouterServices, ask: Callable[[RouterServices], Awaitable[Any]]) -> Any:
    """`run` of what `ask` asks `services`, then the cache writes the request left behind its
    response (a loop that ends at once would cancel them)."""

    async def settled() -> Any:
        answer = await ask(services)
        await services.settled()
        return answer

    return asyncio.run(settled())


def context(principal: Principal = LIMITED, **fields: Any) -> RequestContext:
    return RequestContext(principal=principal, location_headers=LONDON, **fields)


def chat(model: str = "glm", **fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model=model, messages=[{"role": "user", "content": "hi there"}], **fields
    )


def tokens_left(services: Any, principal: Principal = LIMITED) -> int:
    limiter = services.chat.admission.limiter
    return int(limiter.headers(principal)["x-ratelimit-remaining-tokens"])


def no_gate(**router: Any):
    config = app_config(**router)
    gate = config.security.moderation_gate.model_copy(update={"models": []})
    security = config.security.model_copy(update={"moderation_gate": gate})
    return config.model_copy(update={"security": security})


# ---- chat: admission, settlement, cache --------------------------------------------------------


def test_a_completion_is_charged_its_real_usage_not_its_estimate():
    services = services_for(no_gate(), fake_handles())
    answer = run(services.chat.complete(chat(max_tokens=500), context()))
    assert answer.value.choices[0].message.content == "hello from the fake model"
    assert answer.value.usage.total_tokens == 12
    # The reservation (input + 500) was settled to the 12 tokens used.
    assert TOKENS_PER_MINUTE - tokens_left(services) in (12, 11)
    assert answer.headers["x-edge-colo"] == "LHR" and "x-ratelimit-limit-tokens" in answer.headers


def test_a_failed_completion_refunds_its_reservation():
    handles = fake_handles(glm=FakeChatHandle(fail=InvalidRequestError("bad", param="messages")))
    services = services_for(no_gate(), handles)
    with pytest.raises(InvalidRequestError):
        run(services.chat.complete(chat(max_tokens=500), context()))
    assert tokens_left(services) >= TOKENS_PER_MINUTE - 1


def test_admission_refuses_over_the_rate_limit_before_any_model_call():
    handles = fake_handles()
    services = services_for(no_gate(), handles)
    tiny = Principal("bob", RateLimits(requests_per_minute=1))
    run(services.chat.complete(chat(), context(tiny)))
    with pytest.raises(RateLimitedError) as limited:
        run(services.chat.complete(chat(), context(tiny)))
    assert "retry-after" in limited.value.response_headers()
    assert len(handles["glm"].complete.calls) == 1


def test_unknown_model_and_wrong_task_are_refused_before_admission():
    services = services_for(no_gate(), fake_handles())
    with pytest.raises(ModelNotFoundError):
        run(services.chat.complete(chat("gpt-5"), context()))
    with pytest.raises(WrongTaskError):
        run(services.chat.complete(chat("embedding"), context()))
    assert tokens_left(services) == TOKENS_PER_MINUTE  # nothing reserved


def test_a_deterministic_chat_is_cached_per_key_and_a_hit_is_still_charged():
    handles = fake_handles()
    services = services_for(no_gate(), handles)
    first = run(services.chat.complete(chat(temperature=0), context()))
    again = run(services.chat.complete(chat(temperature=0), context()))
    assert (first.headers["x-edge-cache"], again.headers["x-edge-cache"]) == ("MISS", "HIT")
    assert again.value == first.value and len(handles["glm"].complete.calls) == 1
    assert TOKENS_PER_MINUTE - tokens_left(services) in (24, 23)  # the hit used 12 too
    other = Principal("carol", LIMITED.limits)
    assert (
        run(services.chat.complete(chat(temperature=0), context(other))).headers["x-edge-cache"]
        == "MISS"
    )


def test_sampled_bypassed_and_workers_chats_are_not_cached():
    handles = fake_handles()
    services = services_for(no_gate(), handles)
    sampled = run(services.chat.complete(chat(temperature=0.7), context()))
    bypass = run(services.chat.complete(chat(seed=1), context(cache_bypass=True)))
    workers = run(services.chat.complete(chat(seed=2), context(), use_cache=False))
    for answer in (sampled, bypass, workers):
        assert "x-edge-cache" not in answer.headers
    assert len(handles["glm"].complete.calls) == 3


# ---- the moderation gate ------------------------------------------------------------------------


def test_the_gate_refuses_flagged_input_of_a_gated_model_and_cancels_its_generation():
    glm = FakeChatHandle()
    cancelled: list[bool] = []

    async def generating(*args: Any) -> Any:
        try:
            await asyncio.Event().wait()  # a generation that would take a while
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    glm.complete.run = generating
    services = services_for(app_config(), fake_handles(glm=glm))  # glm is gated in serve_config
    bad = ChatCompletionRequest(
        model="glm", messages=[{"role": "user", "content": f"you {BAD_WORD} fool"}]
    )
    with pytest.raises(ContentPolicyViolationError):
        run(services.chat.complete(bad, context()))
    # The call left as the check began (they overlap); the refusal cancelled it.
    assert len(glm.complete.calls) == 1 and cancelled == [True]
    assert tokens_left(services) >= TOKENS_PER_MINUTE - 1  # refunded


def test_the_gate_replaces_a_flagged_answer_and_is_off_for_ungated_models():
    gated = services_for(app_config(), fake_handles(glm=FakeChatHandle(text=f"well {BAD_WORD}")))
    answer = run(gated.chat.complete(chat(), context()))
    assert answer.value.choices[0].finish_reason == "content_filter"
    assert BAD_WORD not in answer.value.choices[0].message.content
    open_ = services_for(no_gate(), fake_handles(glm=FakeChatHandle(text=f"well {BAD_WORD}")))
    answer = run(open_.chat.complete(chat(), context()))
    assert answer.value.choices[0].message.content == f"well {BAD_WORD}"


def gate_in(where: str):
    config = app_config()
    gate = config.security.moderation_gate.model_copy(update={"classifier": where})
    security = config.security.model_copy(update={"moderation_gate": gate})
    return config.model_copy(update={"security": security})


def test_the_router_runs_an_embedded_gate_classifier_itself_opened_from_models_dir():
    handles, in_router = fake_handles(), FakeInRouterModeration()
    config = app_config()
    services = services_for(config, handles, in_router=in_router)
    assert in_router.opened == [config.model_path("moderation")]
    answer = run(services.chat.complete(chat(), context()))
    assert answer.value.choices[0].finish_reason == "stop"
    assert in_router.calls and handles["moderation"].classify.calls == []  # no hop


def test_the_gate_can_call_the_moderation_deployment_instead():
    handles, in_router = fake_handles(), FakeInRouterModeration()
    services = services_for(gate_in("deployment"), handles, in_router=in_router)
    assert in_router.opened == []
    run(services.chat.complete(chat(), context()))
    assert handles["moderation"].classify.calls


class SlowVerdicts(FakeModerationHandle):
    """The moderation deployment answering after the loop turned a few times; remembers how many
    streams the chat model had opened by the time the verdict came."""

    def __init__(self, chat_handle: FakeChatHandle) -> None:
        super().__init__()
        self.chat_handle = chat_handle
        self.streams_at_verdict: list[int] = []
        slow = self.classify.run

        async def classify(*args: Any) -> Any:
            for _ in range(5):
                await asyncio.sleep(0)
            self.streams_at_verdict.append(len(self.chat_handle.streams))
            return await slow(*args)

        self.classify.run = classify


@pytest.mark.parametrize("flagged", [False, True])
def test_a_remote_input_check_overlaps_the_stream_and_a_refusal_cancels_it(flagged):
    glm = FakeChatHandle()
    handles = fake_handles(glm=glm, moderation=SlowVerdicts(glm))
    services = services_for(gate_in("deployment"), handles)
    content = f"you {BAD_WORD} fool" if flagged else "hi there"
    request = ChatCompletionRequest(
        model="glm", stream=True, messages=[{"role": "user", "content": content}]
    )

    async def go() -> list[Any]:
        answer = await services.chat.stream(request, context())
        return await collect(answer.value)

    if flagged:
        with pytest.raises(ContentPolicyViolationError):
            run(go())
        assert glm.streams[0].cancelled and glm.streams[0]._sent == 1  # opened, never read on
        assert tokens_left(services) >= TOKENS_PER_MINUTE - 1  # refunded
    else:
        assert "".join(c.text for c in run(go())) == "hello from the fake model"
    # The generation was opened before the input's verdict came: the check overlapped it.
    assert handles["moderation"].streams_at_verdict[0] == 1


class CountingInRouterModeration(FakeInRouterModeration):
    """The router's own classifier (it never yields to the loop), remembering how many streams
    the chat model had opened when it ran."""

    def __init__(self, chat_handle: FakeChatHandle) -> None:
        super().__init__()
        self.chat_handle = chat_handle
        self.streams_at_call: list[int] = []

    def classify(self, texts: list[str]) -> list[ModerationResult]:
        self.streams_at_call.append(len(self.chat_handle.streams))
        return super().classify(texts)


def test_the_routers_own_input_check_runs_after_the_stream_was_opened():
    glm = FakeChatHandle()
    in_router = CountingInRouterModeration(glm)
    services = services_for(app_config(), fake_handles(glm=glm), in_router=in_router)
    request = ChatCompletionRequest(
        model="glm", stream=True, messages=[{"role": "user", "content": "hi there"}]
    )

    async def go() -> list[Any]:
        answer = await services.chat.stream(request, context())
        return await collect(answer.value)

    assert "".join(c.text for c in run(go())) == "hello from the fake model"
    # The input's check (the first call) overlapped the hop: the call had left before it.
    assert in_router.streams_at_call[0] == 1


# ---- edge: failover -----------------------------------------------------------------------------


def test_a_failing_region_is_failed_over_and_the_trace_says_so():
    calls = {"n": 0}
    handle = FakeChatHandle()
    succeed = handle.complete.run

    async def first_fails(*args: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OverloadedError("the first region's replica failed")
        return await succeed(*args)

    handle.complete.run = first_fails
    services = services_for(no_gate(), fake_handles(glm=handle))
    answer = run(services.chat.complete(chat(), context()))
    assert answer.headers["x-edge-route-reason"] == "failover"
    tried = answer.headers["x-edge-failover"].split(",")
    assert len(tried) == 2 and tried[-1] == answer.headers["x-edge-region"]


def test_when_every_colo_fails_the_error_is_a_503():
    handles = fake_handles(glm=FakeChatHandle(fail=OverloadedError("busy", retry_after_s=2)))
    services = services_for(no_gate(), handles)
    with pytest.raises(OverloadedError):
        run(services.chat.complete(chat(), context()))
    assert len(handles["glm"].complete.calls) == services.chat.edge.max_attempts


# ---- streams ------------------------------------------------------------------------------------


async def collect(stream: Any) -> list[Any]:
    return [chunk async for chunk in stream]


def test_a_stream_is_settled_when_it_ends():
    handles = fake_handles()
    services = services_for(no_gate(), handles)

    async def go() -> list[Any]:
        answer = await services.chat.stream(chat(stream=True, max_tokens=500), context())
        assert answer.headers["x-edge-colo"]
        return await collect(answer.value)

    chunks = run(go())
    assert "".join(c.text for c in chunks) == "hello from the fake model"
    assert TOKENS_PER_MINUTE - tokens_left(services) in (12, 11)
    assert handles["glm"].streams[0].cancelled  # the model's slot is freed


def test_a_stream_error_after_the_first_chunk_surfaces_while_iterating():
    handles = fake_handles(glm=FakeChatHandle(stream_fails_after=2))
    services = services_for(no_gate(), handles)

    async def go() -> list[str]:
        answer = await services.chat.stream(chat(stream=True), context())
        seen = []
        with pytest.raises(RuntimeError):
            async for chunk in answer.value:
                seen.append(chunk.text)
        return seen

    assert run(go()) == ["hello ", "from "]
    assert handles["glm"].streams[0].cancelled


def test_a_stream_failing_before_its_first_chunk_raises_with_a_status():
    handles = fake_handles(glm=FakeChatHandle(fail=InvalidRequestError("too long")))
    services = services_for(no_gate(), handles)
    with pytest.raises(InvalidRequestError):
        run(services.chat.stream(chat(stream=True), context()))
    assert tokens_left(services) >= TOKENS_PER_MINUTE - 1


# ---- embeddings and moderation ------------------------------------------------------------------


def embedding_request(**fields: Any) -> EmbeddingRequest:
    return EmbeddingRequest(model="embedding", input=["one two", "three"], **fields)


def test_embeddings_are_cached_and_charged_their_tokens():
    handles = fake_handles()
    services = services_for(no_gate(), handles)
    first = run(services.embeddings.create(embedding_request(), context()))
    again = run(services.embeddings.create(embedding_request(), context()))
    assert first.value.vectors.shape == (2, DIMENSION) and first.value.prompt_tokens == 4 + 3
    assert (first.headers["x-edge-cache"], again.headers["x-edge-cache"]) == ("MISS", "HIT")
    assert len(handles["embedding"].embed.calls) == 1
    assert TOKENS_PER_MINUTE - tokens_left(services) in (2 * 7, 2 * 7 - 1)


def test_two_router_replicas_on_one_sqlite_file_share_answers(tmp_path: Path):
    """What router.cache.backend: sqlite gives the replicas of one node: each opens the file, and
    an answer one made is a hit on the other, the same body, with no second model call."""
    path = tmp_path / "response-cache.sqlite3"
    handles = fake_handles()
    config = no_gate(cache={"timeout_ms": 10_000})  # a loaded machine is slow, not a failure
    replicas = [
        services_for(config, handles, cache_store=SQLiteStore(path, 100, 10_000)) for _ in range(2)
    ]
    answers = [
        run_settled(replicas[i % 2], lambda r: r.embeddings.create(embedding_request(), context()))
        for i in range(4)
    ]
    assert [a.headers["x-edge-cache"] for a in answers] == ["MISS", "HIT", "HIT", "HIT"]
    assert len(handles["embedding"].embed.calls) == 1
    bodies = {orjson.dumps(a.value.body(), option=orjson.OPT_SERIALIZE_NUMPY) for a in answers}
    assert len(bodies) == 1
    moderation = ModerationRequest(model="moderation", input="hi")
    moderations = [
        run_settled(r, lambda r: r.moderations.create(moderation, context())) for r in replicas
    ]
    assert [m.headers["x-edge-cache"] for m in moderations] == ["MISS", "HIT"]
    assert moderations[1].value == moderations[0].value
    chats = [run_settled(r, lambda r: r.chat.complete(chat(seed=3), context())) for r in replicas]
    assert [c.headers["x-edge-cache"] for c in chats] == ["MISS", "HIT"]
    assert chats[1].value == chats[0].value


class DownStore:
    name = "redis"

    async def get(self, key: str) -> bytes | None:
        raise StoreUnavailable("redis: connection refused")

    async def put(self, key: str, value: bytes, ttl_s: float, release_token: str = "") -> None:
        raise StoreUnavailable("redis: connection refused")

    async def claim(self, key: str, token: str, ttl_s: float) -> bool:
        raise StoreUnavailable("redis: connection refused")

    async def get_or_claim(self, key: str, token: str, ttl_s: float) -> bytes | bool:
        raise StoreUnavailable("redis: connection refused")

    async def renew(self, key: str, token: str, ttl_s: float) -> bool:
        raise StoreUnavailable("redis: connection refused")

    async def release(self, key: str, token: str) -> None:
        raise StoreUnavailable("redis: connection refused")

    async def close(self) -> None:
        pass


class HeldWrites:
    """A shared store in a dict whose writes wait until `writable` is set; it records its
    calls, and holds marks as a backend does."""

    name = "held"

    def __init__(self) -> None:
        self.entries: dict[str, bytes] = {}
        self.marks: dict[str, str] = {}
        self.calls: list[str] = []
        self.writable = asyncio.Event()

    async def get(self, key: str) -> bytes | None:
        self.calls.append("get")
        return self.entries.get(key)

    async def put(self, key: str, value: bytes, ttl_s: float, release_token: str = "") -> None:
        self.calls.append("put")
        await self.writable.wait()
        self.entries[key] = value
        if release_token and self.marks.get(key) == release_token:
            del self.marks[key]

    async def claim(self, key: str, token: str, ttl_s: float) -> bool:
        self.calls.append("claim")
        return self.marks.setdefault(key, token) == token

    async def get_or_claim(self, key: str, token: str, ttl_s: float) -> bytes | bool:
        self.calls.append("get_or_claim")
        return self.entries.get(key) or self.marks.setdefault(key, token) == token

    async def renew(self, key: str, token: str, ttl_s: float) -> bool:
        return self.marks.get(key) == token

    async def release(self, key: str, token: str) -> None:
        self.calls.append("release")
        if self.marks.get(key) == token:
            del self.marks[key]

    async def close(self) -> None:
        pass


def test_a_miss_is_answered_before_the_shared_store_is_written():
    """The answer of a miss is this replica's at once (the repeat is a HIT, its waiters get it)
    and is written to the shared store behind the response, the mark released with the write:
    another replica's waiter finds the answer once the mark is gone, never neither."""
    store = HeldWrites()
    services = services_for(no_gate(), fake_handles(), cache_store=store)

    async def answer() -> Any:  # bounded: a request that waited for the write would hang
        return await asyncio.wait_for(
            services.embeddings.create(embedding_request(), context()), 10
        )

    async def scenario() -> list[Any]:
        answers = [await answer(), await answer()]
        await asyncio.sleep(0)  # the write behind the response has started
        assert store.entries == {} and len(store.marks) == 1  # held while the write waits
        store.writable.set()
        await services.settled()
        return answers

    answers = run(scenario())
    assert [a.headers["x-edge-cache"] for a in answers] == ["MISS", "HIT"]
    assert len(store.entries) == 1 and store.marks == {}
    assert store.calls[-1] == "put" and "release" not in store.calls  # the mark went with it


def test_a_down_cache_backend_serves_every_request_and_counts_the_failures():
    config = no_gate(cache={"local_entries": 0})  # no local tier to answer the repeat
    metrics = InMemoryMetricsBackend()
    observability = RouterObservability(
        config.observability,
        config.models,
        metrics_backend=metrics,
        access_logger=configure_access_logger(stream=io.StringIO()),
    )
    handles = fake_handles()
    services = services_for(config, handles, cache_store=DownStore(), observability=observability)
    answers = [run(services.embeddings.create(embedding_request(), context())) for _ in range(2)]
    # The first request's lookup and store failed; the second's store was not asked (it is down).
    assert len(handles["embedding"].embed.calls) == 2
    assert [a.headers["x-edge-cache"] for a in answers] == ["MISS", "MISS"]
    failures = "edge_cache_backend_failures_total"
    assert metrics.total(failures, backend="redis", reason="error") == 1
    assert metrics.total(failures, backend="redis", reason="down") == 3


def test_a_disabled_cache_says_nothing_about_the_cache():
    services = services_for(no_gate(cache={"enabled": False}), fake_handles())
    answer = run(services.embeddings.create(embedding_request(), context()))
    assert "x-edge-cache" not in answer.headers


def test_a_wrong_dimensions_is_refused_by_the_replica_check_and_refunded():
    services = services_for(no_gate(), fake_handles())
    with pytest.raises(InvalidRequestError) as refused:
        run(services.embeddings.create(embedding_request(dimensions=3), context()))
    assert refused.value.param == "dimensions"
    assert tokens_left(services) >= TOKENS_PER_MINUTE - 1


def test_the_dimensions_travel_to_the_replica_with_the_texts():
    handles = fake_handles()
    services = services_for(no_gate(), handles)
    run(services.embeddings.create(embedding_request(dimensions=DIMENSION), context()))
    request = handles["embedding"].embed.calls[0]
    assert (request.texts, request.dimensions) == (["one two", "three"], DIMENSION)


def test_a_failed_embedding_refunds_and_a_workers_embedding_is_uncached():
    services = services_for(
        no_gate(), fake_handles(embedding=FakeEmbeddingHandle(fail=OverloadedError("x")))
    )
    with pytest.raises(OverloadedError):
        run(services.embeddings.embed("embedding", ["a"], context()))
    assert tokens_left(services) >= TOKENS_PER_MINUTE - 1
    fine = services_for(no_gate(), fake_handles())
    answer = run(fine.embeddings.embed("embedding", ["a"], context()))
    assert answer.value.vectors.shape == (1, DIMENSION) and "x-edge-cache" not in answer.headers


def test_a_workers_answer_is_never_stored_for_the_openai_api():
    """The Workers AI paths go through the same service path, uncached: the same texts asked on
    the OpenAI API afterwards are a miss that calls the model again."""
    handles = fake_handles()
    services = services_for(no_gate(), handles)
    workers = run(services.embeddings.embed("embedding", ["one two", "three"], context()))
    openai = run(services.embeddings.create(embedding_request(), context()))
    assert "x-edge-cache" not in workers.headers and openai.headers["x-edge-cache"] == "MISS"
    assert len(handles["embedding"].embed.calls) == 2
    assert workers.value.prompt_tokens == openai.value.prompt_tokens == 4 + 3
    verdicts = run(services.moderations.classify("moderation", ["hi", BAD_WORD], context()))
    assert [r.flagged for r in verdicts.value.results] == [False, True]
    assert "x-edge-cache" not in verdicts.headers


def test_an_answer_that_cannot_be_made_from_the_reply_is_refunded():
    """A reply the answer cannot be made of (no choices) fails after the model call: the key's
    reservation is still settled, to nothing."""
    services = services_for(no_gate(), fake_handles(glm=ScriptedChatHandle([], [])))
    with pytest.raises(IndexError):
        run(services.chat.complete(chat(max_tokens=500), context()))
    assert tokens_left(services) >= TOKENS_PER_MINUTE - 1


def test_moderation_settles_its_reservation_at_the_estimate():
    services = services_for(no_gate(), fake_handles())
    request = ModerationRequest(input=["fine words", f"{BAD_WORD} words"])
    answer = run(services.moderations.create(request, context()))
    assert [r.flagged for r in answer.value.results] == [False, True]
    charged = TOKENS_PER_MINUTE - tokens_left(services)
    assert (
        0 < charged <= 8
    )  # its estimate (the model counts no tokens), never the reservation's leftovers
    run(services.moderations.classify("moderation", ["x"], context()))
    assert TOKENS_PER_MINUTE - tokens_left(services) > charged


def test_a_failed_moderation_is_refunded():
    handles = fake_handles()

    async def fails(*args: Any) -> Any:
        raise OverloadedError("down")

    handles["moderation"].classify.run = fails
    services = services_for(no_gate(), handles)
    with pytest.raises(OverloadedError):
        run(services.moderations.create(ModerationRequest(input="hello"), context()))
    assert tokens_left(services) >= TOKENS_PER_MINUTE - 1
