"""Gateway state on the session cluster (two router replicas, PostgreSQL): a virtual key made
and revoked while both routers serve is refused by every one within 2 s; the database killed
under load fails no request, and the records queued meanwhile are written once it is back."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

import asyncpg
import httpx
import pytest
from conftest import ADMIN_KEY, LOAD, USER, ServeCluster, wait_until

from edgectl.local_services import PostgresServer

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
REVOCATION_BOUND_S = 2.0  # what the docs promise: every router refuses a revoked key within it
BURST = 16  # concurrent requests: Serve's proxy spreads them over both router replicas


@pytest.fixture(scope="module")
def http(serve_cluster: ServeCluster) -> httpx.Client:
    with httpx.Client(base_url=serve_cluster.base_url, timeout=120) as client:
        yield client


@pytest.fixture
def cluster_postgres(
    serve_cluster: ServeCluster, unavailable: Callable[[str], NoReturn]
) -> PostgresServer:
    """The session cluster's PostgreSQL; `unavailable` where the machine has none (the cluster
    then runs on SQLite)."""
    if serve_cluster.postgres is None:
        unavailable(f"{serve_cluster.no_postgres}: the session cluster runs on SQLite")
    return serve_cluster.postgres


def burst_statuses(http: httpx.Client, secret: str) -> set[int]:
    headers = {"authorization": f"Bearer {secret}"}
    with ThreadPoolExecutor(BURST) as pool:
        answers = pool.map(lambda _: http.get("/v1/models", headers=headers), range(BURST))
        return {answer.status_code for answer in answers}


def test_a_revoked_key_is_refused_by_every_router_within_two_seconds(http: httpx.Client):
    made = http.post("/admin/keys", json={"name": "live-revoke"}, headers=ADMIN)
    assert made.status_code == 201, made.text
    key_id, secret = made.json()["id"], made.json()["key"]
    created = time.monotonic()
    wait_until(lambda: burst_statuses(http, secret) == {200}, 30, "the new key on every router")
    known_s = time.monotonic() - created

    assert http.delete(f"/admin/keys/{key_id}", headers=ADMIN).status_code == 200
    revoked = time.monotonic()
    wait_until(lambda: burst_statuses(http, secret) == {401}, 30, "the key refused everywhere")
    refused_s = time.monotonic() - revoked
    for _ in range(3):  # and it stays refused, whichever router answers
        assert burst_statuses(http, secret) == {401}
    print(f"new key served everywhere after {known_s:.2f} s, refused after {refused_s:.2f} s")
    assert refused_s <= REVOCATION_BOUND_S


def test_a_queued_batch_runs_on_the_warm_embedding_replicas_and_answers_as_run_does(
    http: httpx.Client,
):
    """Workers AI's Batch API end to end: submitted with queueRequest, polled by request_id
    until a router replica's runner has run it on the (warm) embedding pool; each response is
    what the same input answers interactively, with its external_reference."""
    texts = ["a batch of one", "and of another"]
    submitted = http.post(
        "/ai/run/embedding?queueRequest=true",
        json={"requests": [{"text": [texts[0]]}, {"text": [texts[1]], "external_reference": "b"}]},
        headers=LOAD,
    )
    assert submitted.status_code == 200, submitted.text
    queued = submitted.json()["result"]
    assert queued["status"] == "queued" and queued["model"] == "embedding"
    poll = {"request_id": queued["request_id"]}

    def done() -> dict | None:
        answer = http.post("/ai/run/embedding", json=poll, headers=LOAD)
        assert answer.status_code == 200, answer.text
        result = answer.json()["result"]
        assert "responses" in result or result["status"] in ("queued", "running"), result
        return result if "responses" in result else None

    wait_until(lambda: done() is not None, 120, "the batch done")
    result = done()
    assert result is not None
    responses = sorted(result["responses"], key=lambda r: r["id"])
    assert [r["id"] for r in responses] == [0, 1] and all(r["success"] for r in responses)
    assert [r["external_reference"] for r in responses] == [None, "b"]
    for text, response in zip(texts, responses, strict=True):
        alone = http.post("/ai/run/embedding", json={"text": [text]}, headers=LOAD).json()
        assert response["result"]["shape"] == alone["result"]["shape"] == [1, 384]
        assert response["result"]["data"][0] == pytest.approx(alone["result"]["data"][0], abs=1e-5)
    assert result["usage"]["prompt_tokens"] > 0
    # Another key's poll does not see the job.
    other = http.post("/ai/run/embedding", json=poll, headers=USER)
    assert other.status_code == 404 and other.json()["errors"][0]["code"] == 9304, other.text


@pytest.mark.disruptive
def test_the_database_killed_under_load_fails_no_request_and_loses_no_record(
    http: httpx.Client, serve_cluster: ServeCluster, cluster_postgres: PostgresServer
):
    postgres = cluster_postgres
    run = uuid.uuid4().hex[:8]
    statuses: list[int] = []
    stop = threading.Event()

    def load(worker: int) -> None:
        """One embeddings request after another, each with an id of its own in this run."""
        n = 0
        while not stop.is_set():
            n += 1
            answer = http.post(
                "/v1/embeddings",
                json={"model": "embedding", "input": f"state under load {worker}.{n}"},
                headers={**LOAD, "x-request-id": f"{run}-{worker}-{n}", "x-edge-cache": "bypass"},
            )
            statuses.append(answer.status_code)

    workers = [threading.Thread(target=load, args=(worker,)) for worker in range(2)]
    for worker in workers:
        worker.start()
    try:
        wait_until(lambda: len(statuses) >= 20, 60, "load before the kill")
        postgres.kill()
        before = len(statuses)
        wait_until(lambda: len(statuses) >= before + 40, 120, "load with the database down")
        postgres.restart()
        after = len(statuses)
        wait_until(lambda: len(statuses) >= after + 20, 60, "load after the restart")
    finally:
        stop.set()
        for worker in workers:
            worker.join(timeout=120)
    sent = len(statuses)
    assert statuses.count(200) == sent, f"failed: {[s for s in statuses if s != 200]}"

    def logged() -> int:
        rows, cursor = [], None
        while True:
            params = {"key_id": "load", "limit": 1000, **({"before_id": cursor} if cursor else {})}
            page = http.get("/admin/logs", params=params, headers=ADMIN)
            if page.status_code != 200:
                return -1  # the routers' pools still reconnecting
            rows += [r for r in page.json()["data"] if (r["request_id"] or "").startswith(run)]
            cursor = page.json()["next_cursor"]
            if cursor is None:
                return len({r["request_id"] for r in rows})

    counts: list[int] = []
    try:
        wait_until(lambda: counts.append(logged()) or counts[-1] == sent, 120, "the records")
    finally:
        in_database = asyncio.run(_rows_of_run(postgres.dsn, run))
        print(f"{sent} requests; the request log has {counts[-1:]} of them through /admin/logs, "
              f"{in_database} in the database")  # fmt: skip

    def metric(name: str) -> float:
        return _metric_total(httpx.get(serve_cluster.metrics_url, timeout=30).text, name)

    # The outage was real: batches were refused, kept, and written once it was back.
    wait_until(
        lambda: metric("ray_edge_state_write_failures_total") >= 1, 60, "failed batches counted"
    )
    dropped = metric("ray_edge_state_records_dropped_total")
    print(f"{sent} requests, all served and logged; {dropped:g} records dropped")
    assert dropped == 0


def _metric_total(text: str, name: str) -> float:
    """The sum of a Prometheus metric's samples (every router replica's)."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


async def _rows_of_run(dsn: str, run: str) -> int:
    """How many distinct requests of this run the database holds, read directly."""
    connection = await asyncpg.connect(dsn)
    try:
        return int(
            await connection.fetchval(
                "SELECT COUNT(DISTINCT request_id) FROM request_log WHERE request_id LIKE $1",
                f"{run}-%",
            )
        )
    finally:
        await connection.close()
