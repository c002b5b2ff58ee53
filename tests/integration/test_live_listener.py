"""The router replicas' own port (router.listener), on the session cluster beside Serve's proxy:
the same application, one process fewer in the way."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import httpx
import numpy as np
import pytest
from conftest import USER

CHAT = {
    "model": "glm",
    "messages": [{"role": "user", "content": "Tell me about lighthouses."}],
    "max_tokens": 12,
    "temperature": 0,
}


def _listening_sockets(port: int) -> int:
    """Sockets listening on `port` on this host (IPv4), from /proc/net/tcp."""
    count = 0
    with open("/proc/net/tcp", encoding="ascii") as table:
        next(table)
        for line in table:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.split(":")[1], 16) == port:
                count += 1
    return count


@pytest.fixture(scope="module")
def both(serve_cluster) -> tuple[httpx.Client, httpx.Client]:
    with (
        httpx.Client(base_url=serve_cluster.base_url, timeout=120, headers=USER) as proxy,
        httpx.Client(base_url=serve_cluster.listener_url, timeout=120, headers=USER) as own,
    ):
        yield proxy, own


def test_every_router_replica_listens_on_the_shared_port(serve_cluster):
    port = urlsplit(serve_cluster.listener_url).port
    assert port is not None
    assert _listening_sockets(port) == serve_cluster.running_replicas("router")


def test_the_same_answers_as_through_the_proxy(both):
    proxy, own = both
    answers = [c.post("/v1/chat/completions", json=CHAT).json() for c in both]
    assert answers[0]["choices"][0]["message"] == answers[1]["choices"][0]["message"]
    texts = {"model": "embedding", "input": ["a lighthouse", "the sea"]}
    vectors = [
        [d["embedding"] for d in c.post("/v1/embeddings", json=texts).json()["data"]] for c in both
    ]
    np.testing.assert_allclose(np.array(vectors[0]), np.array(vectors[1]), atol=1e-5)


def test_a_stream_through_the_own_port(both):
    _, own = both
    with own.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(
        json.loads(e)["choices"][0]["delta"].get("content") or ""
        for e in events[:-1]
        if json.loads(e)["choices"]
    )
    proxy_answer = both[0].post("/v1/chat/completions", json=CHAT).json()
    assert text == proxy_answer["choices"][0]["message"]["content"]


def test_errors_keep_the_api_shape_and_need_a_key(both, serve_cluster):
    unknown = [c.post("/v1/chat/completions", json={**CHAT, "model": "nope"}) for c in both]
    assert [r.status_code for r in unknown] == [404, 404]
    assert unknown[0].json() == unknown[1].json()
    assert set(unknown[1].json()["error"]) >= {"message", "type"}
    anonymous = httpx.post(f"{serve_cluster.listener_url}/v1/chat/completions", json=CHAT)
    assert anonymous.status_code == 401
