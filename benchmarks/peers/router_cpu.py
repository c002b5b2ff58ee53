"""CPU per request of the router replicas and of the front (Serve's proxy or HAProxy), per
endpoint, read from their own processes: counters before and after N requests. The figure is the
processes' whole CPU over the load window; their idle burn (measured just before) is reported
beside it, never subtracted."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.http_load import Endpoint, async_client, timed_post
from benchmarks.models import CHAT_PROMPT, benchmark_sentences
from benchmarks.peers import cpu
from benchmarks.peers.config import PeersBenchConfig
from benchmarks.router import BYPASS_CACHE, EDGE_APP

ROUTER_TITLE = f"ray::ServeReplica:{EDGE_APP}:router"
PROXY_TITLE = "ray::ProxyActor"

log = logging.getLogger(__name__)


async def bench_router_cpu(config: PeersBenchConfig, base_url: str) -> dict[str, Any]:
    """µs of CPU per request in the router replicas (and the proxy), per endpoint: the process
    counters before and after `cpu_requests` requests, from `cpu_clients` closed loops."""
    routers = cpu.worker_pids(ROUTER_TITLE)
    # The front: Serve's Python proxy, plus HAProxy when it fronts the replicas.
    proxies = cpu.worker_pids(PROXY_TITLE) + cpu.haproxy_pids()
    if not routers:
        return {"error": f"no {ROUTER_TITLE} process found below this driver"}
    sentences = benchmark_sentences(256)
    chat_body = {
        "model": "glm",
        "messages": list(CHAT_PROMPT),
        "max_tokens": 8,
        "temperature": 0.7,
    }
    endpoints: dict[str, tuple[str, Callable[[int], dict[str, Any]]]] = {
        "embeddings": (
            "/v1/embeddings",
            lambda n: {"model": "embedding", "input": sentences[n % len(sentences)]},
        ),
        "moderations": ("/v1/moderations", lambda n: {"input": sentences[n % len(sentences)]}),
        "chat_completions": ("/v1/chat/completions", lambda n: {**chat_body, "seed": n}),
    }
    result: dict[str, Any] = {"router_replicas": len(routers), "front_processes": len(proxies)}
    async with async_client(config.cpu_clients) as client:
        for name, (path, body) in endpoints.items():
            endpoint = Endpoint(f"{base_url}{path}", BYPASS_CACHE)
            requests = (
                config.cpu_requests if name != "chat_completions" else config.cpu_requests // 4
            )
            await timed_post(client, endpoint, body(0), time.perf_counter)  # warm
            # What the replicas burn with no request (metrics pushes, long polls): reported beside
            # the per-request figure, which stays the processes' whole CPU over the load window.
            idle_before = (cpu.cpu_seconds(routers), cpu.cpu_seconds(proxies))
            await asyncio.sleep(config.cpu_idle_s)
            idle_rate = (
                (cpu.cpu_seconds(routers) - idle_before[0]) / config.cpu_idle_s,
                (cpu.cpu_seconds(proxies) - idle_before[1]) / config.cpu_idle_s,
            )
            started = time.perf_counter()
            before = (cpu.cpu_seconds(routers), cpu.cpu_seconds(proxies))
            counter = iter(range(requests))

            async def loop(
                endpoint: Endpoint = endpoint,
                body: Callable = body,
                counter: Iterator[int] = counter,
            ) -> None:
                for n in counter:
                    await timed_post(client, endpoint, body(n), time.perf_counter)

            await asyncio.gather(*(loop() for _ in range(config.cpu_clients)))
            elapsed = time.perf_counter() - started
            router_s = cpu.cpu_seconds(routers) - before[0]
            proxy_s = cpu.cpu_seconds(proxies) - before[1]
            result[name] = {
                "requests": requests,
                "seconds": round(elapsed, 2),
                "router_cpu_us_per_request": round(router_s / requests * 1e6, 1),
                "front_cpu_us_per_request": round(proxy_s / requests * 1e6, 1),
                # The idle burn's share of the window, per request: context, not a discount.
                "router_idle_us_per_request": round(idle_rate[0] * elapsed / requests * 1e6, 1),
                "idle_cpu_per_s": {
                    "router": round(idle_rate[0], 4),
                    "front": round(idle_rate[1], 4),
                },
            }
            log.info("router CPU %s: %s", name, result[name])
    return result
