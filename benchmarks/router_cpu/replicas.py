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

from benchmarks.lib import processes
from benchmarks.lib.corpus import benchmark_sentences, chat_messages
from benchmarks.lib.edge_app import BYPASS_CACHE, EDGE_APP
from benchmarks.lib.http_load import Endpoint, async_client, ready, timed_post

ROUTER_TITLE = f"ray::ServeReplica:{EDGE_APP}:router"
PROXY_TITLE = "ray::ProxyActor"

log = logging.getLogger(__name__)


async def measure_replicas(
    base_url: str, requests: int, clients: int, idle_s: float
) -> dict[str, Any]:
    """µs of CPU per request in the router replicas (and the front), per endpoint: the process
    counters before and after `requests` requests (a quarter of them for chat), from `clients`
    closed loops; `idle_s` of idle burn sampled before each endpoint's load."""
    routers = processes.worker_pids(ROUTER_TITLE)
    if not routers:
        return {"error": f"no {ROUTER_TITLE} process found below this driver"}
    sentences = benchmark_sentences(256)
    chat_body = {
        "model": "glm",
        "messages": chat_messages(),
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
    result: dict[str, Any] = {"router_replicas": len(routers), "front_processes": len(front_pids())}
    async with async_client(clients) as client:
        for name, (path, body) in endpoints.items():
            endpoint = Endpoint(f"{base_url}{path}", BYPASS_CACHE)
            count = requests if name != "chat_completions" else max(1, requests // 4)
            await ready(client, endpoint, body(0))  # warm
            # What the replicas burn with no request (metrics pushes, long polls): reported beside
            # the per-request figure, which stays the processes' whole CPU over the load window.
            idle_before = cpu_reading()
            await asyncio.sleep(idle_s)
            idle_rate = tuple(seconds / idle_s for seconds in cpu_used(idle_before, cpu_reading()))
            started = time.perf_counter()
            before = cpu_reading()
            counter = iter(range(count))

            async def loop(
                endpoint: Endpoint = endpoint,
                body: Callable = body,
                counter: Iterator[int] = counter,
            ) -> None:
                for n in counter:
                    await timed_post(client, endpoint, body(n), time.perf_counter)

            await asyncio.gather(*(loop() for _ in range(clients)))
            elapsed = time.perf_counter() - started
            router_s, proxy_s = cpu_used(before, cpu_reading())
            result[name] = {
                "requests": count,
                "seconds": round(elapsed, 2),
                "router_cpu_us_per_request": round(router_s / count * 1e6, 1),
                "front_cpu_us_per_request": round(proxy_s / count * 1e6, 1),
                # The idle burn's share of the window, per request: context, not a discount.
                "router_idle_us_per_request": round(idle_rate[0] * elapsed / count * 1e6, 1),
                "idle_cpu_per_s": {
                    "router": round(idle_rate[0], 4),
                    "front": round(idle_rate[1], 4),
                },
            }
            log.info("router CPU %s: %s", name, result[name])
    return result


Reading = tuple[dict[int, float], dict[int, float]]  # CPU seconds by pid: routers, front


def front_pids() -> list[int]:
    """Serve's Python proxy, plus HAProxy when it fronts the replicas."""
    return processes.worker_pids(PROXY_TITLE) + processes.haproxy_pids()


def cpu_reading() -> Reading:
    """Both sets listed again at each reading: Serve's HAProxy manager starts a new HAProxy
    process on a reload (a replica started or stopped), and the old one exits."""
    routers = processes.worker_pids(ROUTER_TITLE)
    return processes.cpu_seconds_by_pid(routers), processes.cpu_seconds_by_pid(front_pids())


def cpu_used(before: Reading, after: Reading) -> tuple[float, float]:
    """CPU seconds of the routers and of the front between two readings (a process started in
    between counts whole, one gone in between its last part not at all)."""
    return (
        processes.cpu_used_between(before[0], after[0]),
        processes.cpu_used_between(before[1], after[1]),
    )
