"""Keys, per-key rate limits, the moderation gate, and a model replica killed under load."""

from __future__ import annotations

import asyncio
import threading

import httpx
import openai
import pytest
from conftest import LIMITED_KEY, LIMITED_RPM, LOAD, USER, wait_until

CHAT = {"model": "glm", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def http(serve_cluster) -> httpx.Client:
    with httpx.Client(base_url=serve_cluster.base_url, timeout=120) as client:
        yield client


def test_missing_or_unknown_key_is_401_in_openai_shape(http, serve_cluster):
    missing = http.post("/v1/chat/completions", json=CHAT)
    unknown = http.post("/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer x"})
    for response in (missing, unknown):
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
    sdk = openai.OpenAI(base_url=f"{serve_cluster.base_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        sdk.models.list()
    assert http.post("/v1/chat/completions", json=CHAT, headers=USER).status_code == 200


def test_rate_limit_exhaustion_gives_429_with_headers(http):
    limited = {"authorization": f"Bearer {LIMITED_KEY}", "x-edge-cache": "bypass"}
    responses = [
        http.post("/v1/moderations", json={"input": f"n {i}"}, headers=limited)
        for i in range(2 * LIMITED_RPM + 2)
    ]
    ok = [r for r in responses if r.status_code == 200]
    # Each of the 2 router replicas enforces its share of the limit (rounded up).
    assert 1 <= len(ok) <= LIMITED_RPM + 1
    assert int(ok[0].headers["x-ratelimit-limit-requests"]) <= LIMITED_RPM
    refused = next(r for r in responses if r.status_code != 200)
    assert refused.status_code == 429
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    # another key is not affected
    assert http.post("/v1/moderations", json={"input": "x"}, headers=USER).status_code == 200


def test_moderation_gate_refuses_offensive_chat_input(http):
    body = {**CHAT, "messages": [{"role": "user", "content": "you are a fucking idiot"}]}
    refused = http.post("/v1/chat/completions", json=body, headers=USER)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "content_policy_violation"
    streamed = http.post("/v1/chat/completions", json={**body, "stream": True}, headers=USER)
    assert streamed.status_code == 400  # refused before the first byte


def test_killing_a_model_replica_mid_load_fails_no_request(serve_cluster):
    (victim,) = serve_cluster.replica_actors("embedding")
    done = threading.Event()

    def kill_when_busy() -> None:
        done.wait(timeout=30)
        serve_cluster.kill_actor(victim)

    async def load() -> list[httpx.Response]:
        async with httpx.AsyncClient(
            base_url=serve_cluster.base_url, timeout=120, headers=LOAD
        ) as client:
            gate = asyncio.Semaphore(8)

            async def one(i: int) -> httpx.Response:
                async with gate:
                    if i == 60:
                        done.set()
                    return await client.post(
                        "/v1/embeddings",
                        json={"model": "embedding", "input": f"sentence number {i}"},
                        headers={"x-edge-cache": "bypass"},
                    )

            return await asyncio.gather(*(one(i) for i in range(240)))

    killer = threading.Thread(target=kill_when_busy)
    killer.start()
    responses = asyncio.run(load())
    killer.join()
    failed = [(r.status_code, r.text[:200]) for r in responses if r.status_code != 200]
    assert failed == []
    # Serve replaces the killed replica (on a loaded machine, after the load is over).
    wait_until(
        lambda: (
            len(names := serve_cluster.replica_actors("embedding")) == 1 and victim not in names
        ),
        120,
        "a new embedding replica in place of the killed one",
    )
    wait_until(
        lambda: serve_cluster.running_replicas("embedding") == 1,
        60,
        "embedding back to one replica",
    )
