"""One miss, one model call: identical cacheable requests sent at once through the router's
services on fake handles make one model call and get one answer (x-edge-cache: MISS for the
first, JOINED for the others); a failed first call is not served to them; a cut answer is neither
stored nor shared; a waiter gives up after its wait limit; and the router replicas that share a
backend (SQLite, Redis) wait on its "being made" mark."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from router_fakes import (
    BAD_WORD,
    FakeChatHandle,
    FakeEmbeddingHandle,
    app_config,
    fake_handles,
    services_for,
)

from deployments.config import AppConfig, CacheConfig, ConfigError, SingleFlightConfig
from deployments.contracts.chat_deployment import ChatRequest
from deployments.contracts.embedding_deployment import EmbedRequest
from deployments.errors import InvalidRequestError
from deployments.ingress.cache import ResponseCache, SharedStore, SingleFlight
from deployments.ingress.cache.redis_store import RedisStore
from deployments.ingress.cache.sqlite_store import SQLiteStore
from deployments.ingress.protocol import (
    ChatCompletionRequest,
    EmbeddingRequest,
    ModerationCreateResponse,
)
from deployments.ingress.security import Principal, RateLimits
from deployments.ingress.serving.context import RequestContext
from edge_sim.clock import ManualClock
from edgectl.local_services import RedisServer
from tests.waiting import until

N = 8
ANSWER = ModerationCreateResponse(id="modr-1", model="moderation", results=[])
ALICE = Principal("alice", RateLimits(requests_per_minute=1000, tokens_per_minute=1_000_000))


def context() -> RequestContext:
    return RequestContext(principal=ALICE, location_headers={"x-client-geo": "51.5,-0.12"})


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="glm", messages=[{"role": "user", "content": "hi"}], temperature=0, **fields
    )


def no_gate(**router: Any) -> AppConfig:
    config = app_config(**router)
    gate = config.security.moderation_gate.model_copy(update={"models": []})
    return config.model_copy(
        update={"security": config.security.model_copy(update={"moderation_gate": gate})}
    )


class HeldChat(FakeChatHandle):
    """Holds every call until `go` is set; the first `failures` calls fail (after the hold)."""

    def __init__(self, *failures: Exception, **kw: Any):
        super().__init__(**kw)
        self.go = asyncio.Event()
        self.failures = list(failures)

    async def _complete(self, request: ChatRequest) -> Any:
        await self.go.wait()
        if self.failures:
            raise self.failures.pop(0)
        return await super()._complete(request)


class HeldEmbedding(FakeEmbeddingHandle):
    def __init__(self) -> None:
        super().__init__()
        self.go = asyncio.Event()

    async def _embed(self, request: EmbedRequest) -> Any:
        await self.go.wait()
        return await super()._embed(request)


def counting_lookups(services: Any) -> list[None]:
    """Each cache read of the chat and embedding services' cache, recorded: a request that read
    it and missed waits (or leads) with no other turn of the loop in between."""
    reads: list[None] = []
    cache = services.chat.cached.flights.cache
    get, get_or_claim = cache.get, cache.get_or_claim  # a waiter's read; a lead's

    async def counted_get(key: str) -> Any:
        reads.append(None)
        return await get(key)

    async def counted_get_or_claim(key: str, token: str, ttl_s: float) -> Any:
        reads.append(None)
        return await get_or_claim(key, token, ttl_s)

    cache.get, cache.get_or_claim = counted_get, counted_get_or_claim
    return reads


async def all_at_once(services: Any, handle: Any, ask: Callable[[], Any], n: int = N) -> list:
    """`n` identical requests, the model held until each of them looked the cache up."""
    reads = counting_lookups(services)
    tasks = [asyncio.ensure_future(ask()) for _ in range(n)]
    await until(lambda: len(reads) >= n, 10, "every request to look the cache up")
    handle.go.set()
    return await asyncio.gather(*tasks, return_exceptions=True)


def test_identical_chats_at_once_make_one_model_call_and_get_one_answer():
    glm = HeldChat()
    services = services_for(no_gate(), fake_handles(glm=glm))
    answers = asyncio.run(
        all_at_once(services, glm, lambda: services.chat.complete(chat(), context()))
    )
    assert len(glm.complete.calls) == 1
    assert all(answer.value == answers[0].value for answer in answers)
    said = sorted(answer.headers["x-edge-cache"] for answer in answers)
    assert said == ["JOINED"] * (N - 1) + ["MISS"]
    # a waiter is charged what its answer used, as a hit is
    assert all(answer.value.usage.total_tokens == 12 for answer in answers)


def test_identical_embeddings_at_once_make_one_model_call():
    embedding = HeldEmbedding()
    services = services_for(no_gate(), fake_handles(embedding=embedding))
    body = EmbeddingRequest(model="embedding", input=["one two", "three"])
    answers = asyncio.run(
        all_at_once(services, embedding, lambda: services.embeddings.create(body, context()))
    )
    assert len(embedding.embed.calls) == 1
    assert all((a.value.vectors == answers[0].value.vectors).all() for a in answers)


def test_different_requests_or_keys_do_not_wait_for_each_other():
    glm = HeldChat()
    services = services_for(no_gate(), fake_handles(glm=glm))
    bob = Principal("bob", ALICE.limits)
    asks = iter(
        [
            lambda: services.chat.complete(chat(), context()),
            lambda: services.chat.complete(chat(seed=7), context()),
            lambda: services.chat.complete(chat(), RequestContext(principal=bob)),
        ]
    )
    answers = asyncio.run(all_at_once(services, glm, lambda: next(asks)(), n=3))
    assert len(glm.complete.calls) == 3
    assert [a.headers["x-edge-cache"] for a in answers] == ["MISS"] * 3


def test_a_failed_first_call_is_not_served_to_those_waiting_for_it():
    glm = HeldChat(InvalidRequestError("the first call fails", param="messages"))
    services = services_for(no_gate(), fake_handles(glm=glm))
    answers = asyncio.run(
        all_at_once(services, glm, lambda: services.chat.complete(chat(), context()))
    )
    failed = [a for a in answers if isinstance(a, BaseException)]
    served = [a for a in answers if not isinstance(a, BaseException)]
    assert len(failed) == 1 and isinstance(failed[0], InvalidRequestError)
    # one of the waiters made the answer again, for the others
    assert len(glm.complete.calls) == 2 and len(served) == N - 1
    said = sorted(answer.headers["x-edge-cache"] for answer in served)
    # the others waited for it, or came back to the cache once it was there
    assert said[-1] == "MISS" and set(said[:-1]) <= {"HIT", "JOINED"}


def test_a_first_request_whose_client_left_lets_its_waiters_go():
    glm = HeldChat()
    services = services_for(no_gate(), fake_handles(glm=glm))

    async def scenario() -> list[Any]:
        reads = counting_lookups(services)
        tasks = [asyncio.ensure_future(services.chat.complete(chat(), context())) for _ in range(N)]
        await until(lambda: len(reads) >= N, 10, "every request to look the cache up")
        assert len(glm.complete.calls) == 1
        tasks[0].cancel()  # the first, in the model call: the others wait for it
        await until(lambda: len(glm.complete.calls) == 2, 10, "a waiter to make the answer")
        glm.go.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    first, *answers = asyncio.run(scenario())
    assert isinstance(first, asyncio.CancelledError)
    assert len(glm.complete.calls) == 2 and all(a.value == answers[0].value for a in answers)


def test_a_waiter_past_its_wait_limit_calls_the_model_itself():
    glm = HeldChat()
    config = no_gate(cache={"single_flight": {"wait_s": 0.01}})
    services = services_for(config, fake_handles(glm=glm))

    async def scenario() -> list[Any]:
        first = asyncio.ensure_future(services.chat.complete(chat(), context()))
        await until(lambda: glm.complete.calls, 10, "the first call")
        second = asyncio.ensure_future(services.chat.complete(chat(), context()))
        await until(lambda: len(glm.complete.calls) == 2, 10, "the waiter's own call")
        glm.go.set()
        return [await first, await second]

    answers = asyncio.run(scenario())
    assert [a.headers["x-edge-cache"] for a in answers] == ["MISS", "MISS"]


def test_single_flight_off_makes_a_call_per_request():
    glm = HeldChat()
    services = services_for(
        no_gate(cache={"single_flight": {"enabled": False}}), fake_handles(glm=glm)
    )
    asyncio.run(all_at_once(services, glm, lambda: services.chat.complete(chat(), context())))
    assert len(glm.complete.calls) == N


def test_an_answer_cut_by_the_output_gate_is_never_stored_nor_shared():
    glm = HeldChat(text=f"well {BAD_WORD}")
    services = services_for(app_config(), fake_handles(glm=glm))
    answers = asyncio.run(
        all_at_once(services, glm, lambda: services.chat.complete(chat(), context()), n=3)
    )
    assert all(a.value.choices[0].finish_reason == "content_filter" for a in answers)
    assert [a.headers["x-edge-cache"] for a in answers] == ["MISS"] * 3
    assert len(glm.complete.calls) == 3
    again = asyncio.run(services.chat.complete(chat(), context()))
    assert again.headers["x-edge-cache"] == "MISS" and len(glm.complete.calls) == 4


def test_one_cut_choice_of_several_keeps_the_answer_out_of_the_cache():
    glm = HeldChat(text=f"well {BAD_WORD}")
    glm.go.set()
    services = services_for(app_config(), fake_handles(glm=glm))
    for _ in range(2):
        answer = asyncio.run(services.chat.complete(chat(n=2), context()))
        assert answer.headers["x-edge-cache"] == "MISS"
    assert len(glm.complete.calls) == 2


# ---- across router replicas: the backend's "being made" mark ----------------------------------


def test_identical_chats_across_two_router_replicas_on_one_backend_make_one_call(backend):
    glm = HeldChat()
    handles = fake_handles(glm=glm)
    config = no_gate(cache={"timeout_ms": 10_000})  # far above what a loaded machine takes
    replicas = [services_for(config, handles, cache_store=backend()) for _ in range(2)]

    async def scenario() -> list[Any]:
        reads = [counting_lookups(services) for services in replicas]
        tasks = [
            asyncio.ensure_future(services.chat.complete(chat(), context()))
            for services in replicas
            for _ in range(N // 2)
        ]
        await until(lambda: all(len(r) >= N // 2 for r in reads), 10, "every lookup")
        glm.go.set()
        answers = await asyncio.gather(*tasks)
        for services in replicas:
            await services.settled()  # the lead's write and release, behind its response
            await services.chat.cached.flights.cache.close()
        return answers

    answers = asyncio.run(scenario())
    assert len(glm.complete.calls) == 1
    assert all(answer.value == answers[0].value for answer in answers)
    said = sorted(answer.headers["x-edge-cache"] for answer in answers)
    # the others waited for it, or found it stored once they looked
    assert said[-1] == "MISS" and set(said[:-1]) <= {"HIT", "JOINED"}


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], SharedStore]]:
    """Makes a new store on one backend, as each router replica opens its own."""
    if request.param == "sqlite":
        yield lambda: SQLiteStore(tmp_path / "cache.sqlite3", 100, 10_000)
        return
    redis: RedisServer = request.getfixturevalue("redis_server")
    yield lambda: RedisStore(
        redis.url, password=None, key_prefix="t:", max_entries=100, timeout_ms=10_000
    )


def test_a_mark_is_held_by_one_token_until_its_holder_releases_it(backend):
    async def scenario() -> list[bool]:
        store, claims = backend(), []
        try:
            claims.append(await store.claim("k", "a", 60))
            claims.append(await store.claim("k", "b", 60))
            await store.release("k", "b")  # not its holder: no effect
            claims.append(await store.claim("k", "b", 60))
            await store.release("k", "a")
            claims.append(await store.claim("k", "b", 60))
            claims.append(await store.claim("other", "a", 60))
            return claims
        finally:
            await store.close()

    assert asyncio.run(scenario()) == [True, False, False, True, True]


def test_get_or_claim_returns_a_stored_entry_else_claims_as_claim_does(backend):
    """A lead's look in one call: the entry if stored (no mark taken), else claim's answer."""

    async def scenario() -> list[bytes | bool]:
        store = backend()
        try:
            found = [await store.get_or_claim("k", "a", 60), await store.get_or_claim("k", "b", 60)]
            await store.put("k", b"the answer", 60)
            found.append(await store.get_or_claim("k", "b", 60))
            await store.release("k", "a")
            found.append(await store.get_or_claim("k", "b", 60))  # stored: still no mark taken
            found.append(await store.claim("k", "c", 60))
            return found
        finally:
            await store.close()

    assert asyncio.run(scenario()) == [True, False, b"the answer", b"the answer", True]


def test_a_put_removes_the_mark_of_the_token_it_names_and_no_other(backend):
    """A lead's answer goes in and its mark out in one call; another holder's mark stays."""

    async def scenario() -> list[bool]:
        store = backend()
        try:
            await store.claim("k", "a", 60)
            await store.put("k", b"the answer", 60, release_token="b")  # not its holder
            taken = [await store.claim("k", "c", 60)]
            await store.put("k", b"the answer", 60, release_token="a")
            return [*taken, await store.claim("k", "c", 60), await store.get("k") is not None]
        finally:
            await store.close()

    assert asyncio.run(scenario()) == [False, True, True]


def test_only_the_holder_of_a_mark_renews_it(backend):
    async def scenario() -> list[bool]:
        store = backend()
        try:
            await store.claim("k", "a", 60)
            renewed = [await store.renew("k", "a", 60), await store.renew("k", "b", 60)]
            await store.release("k", "a")
            return [*renewed, await store.renew("k", "a", 60)]
        finally:
            await store.close()

    assert asyncio.run(scenario()) == [True, False, False]  # ended: not brought back


async def renewed_for(ticks: Ticks, renewals: int) -> None:
    """Let the lead renew `renewals` times, each once it asked to sleep until the next."""
    for done in range(renewals):
        await until(lambda: len(ticks.asked) > done, 10, f"renewal {done + 1} to be due")  # noqa: B023
        ticks.step()
    await until(lambda: len(ticks.asked) > renewals, 10, "the last renewal")


@pytest.mark.parametrize("ends", ["share", "drop"])
def test_a_lead_renews_its_mark_while_its_call_lasts_and_stops_once_it_ends(
    tmp_path: Path, ends: str
):
    clock = ManualClock(1000.0)
    path = tmp_path / "cache.sqlite3"

    async def scenario() -> list[bool]:
        ticks = Ticks(clock)
        lead_replica = flights(
            SQLiteStore(path, 100, 10_000, clock=clock), clock, ticks, mark_ttl_s=3
        )
        other = SQLiteStore(path, 100, 10_000, clock=clock)
        try:
            made = await lead_replica.find("k")
            assert made.lead is not None
            await renewed_for(ticks, 6)  # 6 s: twice the mark's life
            taken = [await other.claim("k", "other", 3)]
            made.lead.share(ANSWER) if ends == "share" else made.lead.drop()
            await until(lambda: ticks.cancelled == 1, 10, "the renewals to stop")
            await lead_replica.settled()  # the mark's release, behind the response
            taken.append(await other.claim("k", "other", 3))
            return taken
        finally:
            await lead_replica.cache.close()
            await other.close()

    assert asyncio.run(scenario()) == [False, True]  # renewed while made; released once ended
    assert clock() == 1006.0


class Ticks:
    """A Sleep that ends only when the test steps it, then moves `clock` on by what it was
    asked to sleep: a lead's renewals, one at a time. Never stepped, it is a lead that never
    renews (its process died) or whose renewals do not come within the test."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.asked: list[float] = []
        self._steps: asyncio.Queue[None] = asyncio.Queue()

        self.cancelled = 0  # sleeps cut short: the lead ended its renewals

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        try:
            await self._steps.get()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        self.clock.advance(seconds)

    def step(self) -> None:
        self._steps.put_nowait(None)


def flights(
    store: SharedStore, clock: ManualClock, ticks: Ticks | None = None, **config: Any
) -> SingleFlight:
    """A replica's single flight on `store`; it sleeps on `ticks` if given (a lead: its
    renewals wait for the test), else on `clock` (a waiter: its polls move the clock)."""
    cache = ResponseCache(CacheConfig(timeout_ms=10_000), store)
    settings = SingleFlightConfig(**{"wait_s": 3600, "mark_ttl_s": 3600, **config})
    sleep = ticks.sleep if ticks is not None else clock.sleep
    return SingleFlight(cache, settings, clock=clock, sleep=sleep)


def test_a_replica_waits_for_the_answer_another_makes(backend):
    clock = ManualClock()

    async def scenario() -> Any:
        one, other = flights(backend(), clock, Ticks(clock)), flights(backend(), clock)
        try:
            made = await one.find("k")
            assert made.answer is None and made.lead is not None
            waiting = asyncio.ensure_future(other.find("k"))
            await until(lambda: clock() > 0, 10, "the other replica to poll")  # its claim failed
            made.lead.share(ANSWER)
            return await waiting
        finally:
            await one.cache.close()
            await other.cache.close()

    found = asyncio.run(scenario())
    assert (found.answer, found.joined, found.lead) == (ANSWER, True, None)


def test_a_waiter_says_how_long_it_waited_for_the_answer_here_or_on_another_replica(backend):
    clock = ManualClock()

    async def scenario() -> tuple[Any, Any]:
        one, other = flights(backend(), clock, Ticks(clock)), flights(backend(), clock)
        looked = asyncio.Event()
        get = one.cache.get

        async def get_then_say(key: str) -> Any:
            found = await get(key)
            looked.set()
            return found

        one.cache.get = get_then_say  # type: ignore[method-assign]
        try:
            made = await one.find("k")
            assert made.lead is not None
            here = asyncio.ensure_future(one.find("k"))
            await looked.wait()  # it missed and waits for the lead's answer
            elsewhere = asyncio.ensure_future(other.find("k"))
            await until(lambda: clock() > 0, 10, "the other replica to poll")  # moves the clock
            polled_at = clock()
            clock.advance(0.25)
            made.lead.share(ANSWER)
            found_here, found_elsewhere = await here, await elsewhere
            # from its look to the answer: the other replica's polls move the clock on too
            assert polled_at + 0.25 <= found_here.waited_s <= clock()
            return found_here, found_elsewhere
        finally:
            await one.cache.close()
            await other.cache.close()

    here, elsewhere = asyncio.run(scenario())
    assert (here.answer, here.joined) == (ANSWER, True)
    assert (elsewhere.answer, elsewhere.joined) == (ANSWER, True)
    assert elsewhere.waited_s > 0.25  # it polled before the answer and after it


def test_a_replica_makes_the_answer_once_the_others_lead_drops_it(backend):
    clock = ManualClock()

    async def scenario() -> Any:
        one, other = flights(backend(), clock, Ticks(clock)), flights(backend(), clock)
        try:
            made = await one.find("k")
            waiting = asyncio.ensure_future(other.find("k"))
            await until(lambda: clock() > 0, 10, "the other replica to poll")
            assert made.lead is not None
            made.lead.drop()  # the first call failed: its mark goes with it
            return await waiting
        finally:
            await one.cache.close()
            await other.cache.close()

    found = asyncio.run(scenario())
    assert found.answer is None and found.lead is not None


@pytest.mark.parametrize(
    ("settings", "until_s"),
    [({"mark_ttl_s": 2}, 2.0), ({"wait_s": 1}, 1.0)],
    ids=["until-the-mark-ends", "until-wait_s"],
)
def test_a_replica_waits_on_a_mark_whose_maker_died_until_it_ends_or_the_wait_does(
    tmp_path: Path, settings: dict[str, float], until_s: float
):
    clock = ManualClock(1000.0)
    path = tmp_path / "cache.sqlite3"

    async def scenario() -> Any:
        store = SQLiteStore(path, 100, 10_000, clock=clock)
        dead = flights(store, clock, Ticks(clock), **settings)  # its renewals never come
        other = flights(SQLiteStore(path, 100, 10_000, clock=clock), clock, **settings)
        try:
            assert (await dead.find("k")).lead is not None  # ...and never ends it
            start = clock()
            found = await other.find("k")
            return found, clock() - start
        finally:
            await dead.cache.close()
            await other.cache.close()

    found, waited_s = asyncio.run(scenario())
    assert found.answer is None and found.lead is not None
    assert until_s <= waited_s < until_s + 0.1  # polled at most poll_max_ms apart


# ---- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("single_flight", "message"),
    [
        ({"wait_s": 0}, "wait_s"),
        ({"mark_ttl_s": -1}, "mark_ttl_s"),
        ({"poll_min_ms": 100, "poll_max_ms": 10}, r"poll_min_ms \(100\) is above poll_max_ms"),
        ({"wait_s": 500}, r"wait_s \(500\) is above request_timeout_s"),
    ],
)
def test_bad_single_flight_settings_are_refused(single_flight: dict[str, Any], message: str):
    with pytest.raises(ConfigError, match=message):
        app_config(cache={"single_flight": single_flight})
