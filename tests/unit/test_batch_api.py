"""Workers AI's Batch API through the router's app on fake model handles (no Ray) and a real
gateway database: submitted and polled as Cloudflare documents it, run by the runner only on
warm capacity (a cold model's job waits and wakes nothing), in the submitting key's name, and
every bad input a clear envelope error."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from router_fakes import FakeEmbeddingHandle, app_config, fake_handles, services_for
from schema_contracts import assert_valid, envelope_validator
from test_gateway_state_api import ADMIN, ENV, NOW, USER_KEY, Gateway, bearer, open_gateway

from deployments.config.state import BatchConfig
from deployments.errors import InvalidRequestError, QueueFullError
from deployments.ingress.api.app import make_app
from deployments.ingress.serving.batch_runner import BatchRunner
from deployments.ingress.state.postgres import PostgresDatabase
from deployments.ingress.state.sqlite import SqliteDatabase
from edge_sim.region_board import BoardSnapshot
from edge_sim.regions import PoolView
from edgectl.local_cluster import wait_until

SUCCESS = envelope_validator("api-response-common")
FAILURE = envelope_validator("api-response-common-failure")
USER = bearer(USER_KEY)
SUBMIT = "/ai/run/embedding?queueRequest=true"
TEXTS = ["one two", "three four five", "six"]


class PickyEmbeddingHandle(FakeEmbeddingHandle):
    """Refuses a text holding "refused" (a 400 from the replica); pushes back (queue full) as
    often as `full` says first."""

    def __init__(self) -> None:
        super().__init__()
        self.full = 0

    async def _embed(self, request: Any) -> Any:
        if self.full > 0:
            self.full -= 1
            raise QueueFullError("the model's queue is full", retry_after_s=1)
        if any("refused" in text for text in request.texts):
            raise InvalidRequestError("the replica refused this text")
        return await super()._embed(request)


@pytest.fixture
def handle() -> PickyEmbeddingHandle:
    """The embedding model's handle, in every region."""
    return PickyEmbeddingHandle()


@pytest.fixture(params=["sqlite", "postgres"])
def gateway(
    request: pytest.FixtureRequest, tmp_path: Path, handle: PickyEmbeddingHandle
) -> Iterator[Gateway]:
    handles = fake_handles(embedding=handle)
    if request.param == "sqlite":
        connect: Any = lambda: SqliteDatabase(tmp_path / "gateway.sqlite3")  # noqa: E731
    else:
        dsn = request.getfixturevalue("postgres_database")
        connect = lambda: PostgresDatabase(dsn)  # noqa: E731
    yield from open_gateway(connect, ENV, handles)


def warm(gateway: Gateway, *models: str, saturated: bool = False) -> None:
    """What edge-control's snapshot would say: `models` running in every region."""
    regions = app_config().edge.region_names
    view = PoolView(running=1, saturated=saturated)
    gateway.services.pools.snapshot = BoardSnapshot(
        {model: dict.fromkeys(regions, view) for model in models}, {}
    )


def run_batches(gateway: Gateway) -> bool:
    runner = gateway.services.batch_runner
    assert runner is not None
    return bool(gateway.client.portal.call(runner.run_once))  # type: ignore[union-attr]


def until(done: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """The batch worker (its own thread) is done: polled by edgectl's deadline helper."""
    wait_until(done, timeout_s, "the batch worker", every_s=0.05)


def ok(response: Any) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert_valid(SUCCESS, body, "a batch answer")
    return dict(body["result"])


def failed(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert_valid(FAILURE, body, "a batch error")
    (error,) = body["errors"]
    return dict(error)


def submit(gateway: Gateway, requests: list[Any], path: str = SUBMIT, **more: Any) -> Any:
    return gateway.client.post(path, json={"requests": requests, **more}, headers=USER)


def poll(gateway: Gateway, request_id: str, path: str = "/ai/run/embedding") -> Any:
    return gateway.client.post(path, json={"request_id": request_id}, headers=USER)


def test_a_batch_waits_for_warm_capacity_then_answers_as_the_interactive_api(
    gateway: Gateway, handle: PickyEmbeddingHandle
):
    requests = [{"text": text} for text in TEXTS]
    requests[1]["external_reference"] = "doc-7"
    queued = ok(submit(gateway, requests))
    assert queued == {"status": "queued", "request_id": queued["request_id"], "model": "embedding"}
    assert uuid.UUID(queued["request_id"]).version == 4
    job = queued["request_id"]

    # Cold everywhere: the job stays queued, nothing is sent and no region is woken.
    assert not run_batches(gateway)
    assert handle.embed.calls == [] and handle.wake.calls == []
    assert ok(poll(gateway, job)) == queued
    # Warm but every region pushing back: still queued.
    warm(gateway, "embedding", saturated=True)
    assert not run_batches(gateway) and handle.embed.calls == []

    warm(gateway, "embedding")
    assert run_batches(gateway)
    assert handle.wake.calls == []
    done = ok(poll(gateway, job, path="/client/v4/accounts/acct/ai/run/embedding"))
    interactive = [
        ok(gateway.client.post("/ai/run/embedding", json={"text": t}, headers=USER)) for t in TEXTS
    ]
    assert done["responses"] == [
        {"id": i, "result": interactive[i], "success": True, "external_reference": ref}
        for i, ref in enumerate([None, "doc-7", None])
    ]
    prompt_tokens = sum(len(t.split()) + 2 for t in TEXTS)  # the fake's count per text
    assert done["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 0,
        "total_tokens": prompt_tokens,
    }
    # Each item went through the ledger in the submitting key's name.
    gateway.flush()
    rows = gateway.client.portal.call(  # type: ignore[union-attr]
        gateway.state.database.fetch,
        "SELECT key_id, request_id, status FROM request_log WHERE request_id LIKE ?",
        (f"{job}/%",),
    )
    assert sorted(rows) == [("alice", f"{job}/{i}", 200) for i in range(3)]


def test_a_job_shows_running_while_its_items_run(gateway: Gateway, handle: PickyEmbeddingHandle):
    warm(gateway, "embedding")
    job = ok(submit(gateway, [{"text": "slow"}]))["request_id"]
    release = asyncio.Event()
    plain = handle.embed.run  # type: ignore[attr-defined]

    async def held(*args: Any) -> Any:
        await release.wait()
        return await plain(*args)

    handle.embed.run = held  # type: ignore[attr-defined]
    runner = gateway.services.batch_runner
    assert runner is not None
    portal = gateway.client.portal  # type: ignore[union-attr]
    running = portal.start_task_soon(runner.run_once)
    for _ in range(200):
        if handle.embed.calls:
            break
        portal.call(asyncio.sleep, 0.01)
    assert ok(poll(gateway, job)) == {"status": "running", "request_id": job, "model": "embedding"}
    portal.call(release.set)
    assert running.result(timeout=10)
    assert ok(poll(gateway, job))["responses"][0]["success"] is True


def test_a_job_of_a_replica_that_died_is_resumed_from_its_first_unfinished_item(
    gateway: Gateway,
    handle: PickyEmbeddingHandle,
):
    """Another router replica claimed the job, answered item 0 and died: once its lease runs
    out, this replica's runner takes the job over and runs items 1 and 2 only."""
    warm(gateway, "embedding")
    job = ok(submit(gateway, [{"text": t} for t in TEXTS]))["request_id"]
    jobs, lease_s = gateway.state.batches, gateway.state.config.batch.lease_s
    portal = gateway.client.portal  # type: ignore[union-attr]
    assert portal.call(jobs.claim, "dead-replica", ["embedding"], NOW, lease_s) is not None
    answered = {"id": 0, "result": {"from": "the dead replica"}, "success": True}
    assert portal.call(jobs.record, job, "dead-replica", 0, answered, (5, 0), NOW, lease_s)
    assert not run_batches(gateway)  # its lease still holds
    assert ok(poll(gateway, job))["status"] == "running"
    gateway.clock[0] = NOW + lease_s + 1
    assert run_batches(gateway)
    assert [call.texts for call in handle.embed.calls] == [[TEXTS[1]], [TEXTS[2]]]
    done = ok(poll(gateway, job))
    assert [r["id"] for r in done["responses"]] == [0, 1, 2]
    assert done["responses"][0] == answered
    assert done["usage"]["prompt_tokens"] == 5 + sum(len(t.split()) + 2 for t in TEXTS[1:])


@pytest.mark.parametrize("max_in_flight", [1, 2])
def test_a_replica_sends_at_most_max_in_flight_items_at_once(
    gateway: Gateway, handle: PickyEmbeddingHandle, max_in_flight: int
):
    warm(gateway, "embedding")
    ok(submit(gateway, [{"text": f"item {i}"} for i in range(4)]))
    in_flight, most = 0, 0
    plain = handle.embed.run  # type: ignore[attr-defined]

    async def counted(*args: Any) -> Any:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        for _ in range(50):  # turns enough for the next item to arrive, if it is sent
            await asyncio.sleep(0)
        in_flight -= 1
        return await plain(*args)

    handle.embed.run = counted  # type: ignore[attr-defined]
    state, services = gateway.state, gateway.services
    runner = BatchRunner(
        state.batches,
        services.workers,
        services.pools,
        services.keys,
        BatchConfig(max_in_flight=max_in_flight),
        ready=state.ensure_ready,
        wall_clock=state.wall_clock,
    )
    assert gateway.client.portal.call(runner.run_once)  # type: ignore[union-attr]
    assert len(handle.embed.calls) == 4 and most == max_in_flight


def test_an_item_failing_at_run_time_is_its_own_error_and_a_busy_one_waits(
    gateway: Gateway, handle: PickyEmbeddingHandle
):
    warm(gateway, "embedding")
    job = ok(submit(gateway, [{"text": "fine"}, {"text": "refused here"}, {"text": "ok"}]))
    handle.full = 10  # every region pushes back: nothing is answered, the job is queued again
    assert not run_batches(gateway)
    assert ok(poll(gateway, job["request_id"]))["status"] == "queued"
    runner = gateway.services.batch_runner
    assert runner is not None and "embedding" not in runner.free_models()  # pushed back: full
    handle.full = 0
    # The regions that pushed back count as full for edge.region_policy.saturation_hold_s.
    until(lambda: run_batches(gateway))
    responses = ok(poll(gateway, job["request_id"]))["responses"]
    assert [r["success"] for r in responses] == [True, False, True]
    assert responses[1] == {
        "id": 1,
        "success": False,
        "errors": [{"code": 9100, "message": "the replica refused this text"}],
        "external_reference": None,
    }


def test_a_chat_batch_takes_queue_request_in_the_body_and_answers_the_classic_shape(
    gateway: Gateway,
):
    warm(gateway, "glm")
    requests = [
        {"prompt": "hi", "max_tokens": 8},
        {"messages": [{"role": "user", "content": "yo"}]},
    ]
    job = ok(submit(gateway, requests, path="/ai/run/glm", queueRequest=True))
    assert job["model"] == "glm"
    assert run_batches(gateway)
    done = ok(poll(gateway, job["request_id"], path="/ai/run/glm"))
    assert [r["result"]["response"] for r in done["responses"]] == ["hello from the fake model"] * 2
    assert done["usage"]["completion_tokens"] > 0


def test_polls_of_another_keys_job_an_unknown_id_and_an_expired_job(gateway: Gateway):
    warm(gateway, "embedding")
    job = ok(submit(gateway, [{"text": "a"}]))["request_id"]
    other = gateway.new_key()["key"]
    answer = gateway.client.post(
        "/ai/run/embedding", json={"request_id": job}, headers=bearer(other)
    )
    assert failed(answer, 404)["code"] == 9304
    assert failed(poll(gateway, str(uuid.uuid4())), 404)["code"] == 9304
    assert run_batches(gateway)
    ttl_s = gateway.state.config.batch.result_ttl_s
    gateway.clock[0] = NOW + ttl_s + 1
    assert failed(poll(gateway, job), 410)["code"] == 9310
    gateway.client.portal.call(  # type: ignore[union-attr]
        gateway.state.batches.prune, gateway.clock[0], gateway.state.config.batch.tombstone_s
    )
    assert failed(poll(gateway, job), 410)["code"] == 9310  # a tombstone until pruned


def test_items_run_in_the_submitting_keys_name_its_budget_and_revocation_included(
    gateway: Gateway,
):
    warm(gateway, "glm")
    client, chat = gateway.client, [{"prompt": "hi", "max_tokens": 16}]
    capped = gateway.new_key(budget={"cost_units": 1e-9, "period": "day"})
    revoked = gateway.new_key()
    jobs = [
        ok(client.post("/ai/run/glm?queueRequest=true", json={"requests": chat}, headers=h))
        for h in (bearer(capped["key"]), bearer(revoked["key"]))
    ]
    assert client.delete(f"/admin/keys/{revoked['id']}", headers=ADMIN).status_code == 200
    assert run_batches(gateway) and run_batches(gateway)
    over_budget = client.post(
        "/ai/run/glm", json={"request_id": jobs[0]["request_id"]}, headers=bearer(capped["key"])
    )
    (response,) = ok(over_budget)["responses"]
    assert response["success"] is False and response["errors"][0]["code"] == 9201
    # The revoked key cannot poll, and its job's item was refused as it would be.
    listed = gateway.client.portal.call(  # type: ignore[union-attr]
        gateway.state.batches.results, jobs[1]["request_id"]
    )
    assert [r.response["errors"][0]["code"] for r in listed if r.response] == [10000]


@pytest.mark.parametrize(
    ("body", "status", "code", "says"),
    [
        ({"queueRequest": True}, 400, 9100, "`requests`"),
        ({"requests": []}, 400, 9100, "empty"),
        ({"requests": "text"}, 400, 9100, "a list"),
        ({"requests": [{"text": "a"}] * 1001}, 400, 9100, "more than the 1000"),
        ({"requests": [{"text": "a"}, {"txt": "b"}]}, 400, 9100, "requests[1]: "),
        ({"requests": [{"text": "a"}, "b"]}, 400, 9100, "requests[1]: expected an object"),
        ({"requests": [{"text": "a"}], "request_id": "x"}, 400, 9100, "one of them"),
        ({"requests": [{"text": "a"}], "priority": 1}, 400, 9100, "'priority'"),
    ],
)
def test_a_bad_submission_is_a_clear_envelope_error(
    gateway: Gateway, body: dict[str, Any], status: int, code: int, says: str
):
    answer = gateway.client.post(SUBMIT, json=body, headers=USER)
    error = failed(answer, status)
    assert error["code"] == code and says in error["message"]
    rows = gateway.client.portal.call(  # type: ignore[union-attr]
        gateway.state.database.fetch, "SELECT COUNT(*) FROM batch_jobs"
    )
    assert rows == [(0,)]  # nothing half-queued


def test_a_stream_item_and_an_unknown_model_are_refused(gateway: Gateway):
    stream = [{"prompt": "hi"}, {"prompt": "hi", "stream": True}]
    error = failed(submit(gateway, stream, path="/ai/run/glm?queueRequest=true"), 400)
    assert error["message"].startswith("requests[1]: stream is not available in a batch")
    unknown = submit(gateway, [{"text": "a"}], path="/ai/run/nope?queueRequest=true")
    assert failed(unknown, 404)["code"] == 5007


def test_a_key_may_batch_only_the_models_it_may_use(gateway: Gateway):
    limited = gateway.new_key(models=["glm"])["key"]
    answer = gateway.client.post(
        SUBMIT, json={"requests": [{"text": "a"}]}, headers=bearer(limited)
    )
    assert failed(answer, 403)["code"] == 9200


def test_the_batch_api_without_gateway_state_is_a_400_saying_it_is_off():
    config = app_config()
    services = services_for(config, fake_handles())
    with TestClient(make_app(config, services), raise_server_exceptions=False) as client:
        answer = client.post(SUBMIT, json={"requests": [{"text": "a"}]})
        error = failed(answer, 400)
        assert error["code"] == 9100 and "off on this gateway" in error["message"]
        assert services.batch_runner is None


def test_the_batch_api_with_its_database_gone_is_a_503(tmp_path: Path):
    sqlite = lambda: SqliteDatabase(tmp_path / "gateway.sqlite3")  # noqa: E731
    for gateway in open_gateway(sqlite, ENV):
        gateway.client.portal.call(gateway.state.database.close)  # type: ignore[union-attr]
        (tmp_path / "gateway.sqlite3").rename(tmp_path / "moved.sqlite3")  # an empty one opens
        assert failed(submit(gateway, [{"text": "a"}]), 503)["code"] == 9505
        assert failed(poll(gateway, str(uuid.uuid4())), 503)["code"] == 9505
