"""The router's CPU per request, in process: `make_app` on the shared fake model handles
(benchmarks.lib.fake_handles; 384-dimensional float32 vectors, as the default embedding model
returns), driven by direct ASGI calls, so the figure is the router's own work (routes, validation,
edge, telemetry, encoding) without Ray or a socket. Beside it, the embeddings body's old and new
encoders on the same vectors, and the ledger's cost (gateway state off vs on, in one run).

`python -m benchmarks.router_cpu.in_process --profile ENDPOINT` prints the hot path of one
endpoint (cProfile). The router's own time per request as its header says it:
benchmarks.router_cpu.overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import itertools
import json
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib.fake_handles import (
    FakeEmbeddingHandle,
    app_config,
    handle_for_task,
    in_every_region,
)
from benchmarks.router_cpu.encoders import DIMENSION, encoder_comparison
from deployments.config import PROJECT_ROOT, AppConfig
from deployments.ingress.api.app import make_app
from deployments.ingress.cache import SharedStore
from deployments.ingress.security import KeyStore
from deployments.ingress.serving.services import build_services
from deployments.ingress.state.gateway import GatewayState
from deployments.ingress.state.sqlite import SqliteDatabase
from deployments.observability import RouterObservability
from deployments.observability.access_log import configure_access_logger

USER_KEY = "sk-bench-0123456789abcdef"
SENTENCE = "The quick brown fox jumps over the lazy dog near the riverbank at dawn."


# ---- the app under test -------------------------------------------------------------------------


def _fake_handle(task: str) -> Any:
    if task == "embedding":
        return FakeEmbeddingHandle(dimension=DIMENSION, rng=np.random.default_rng(0))
    return handle_for_task(task)


def bench_app(
    config: AppConfig, state: GatewayState | None = None, cache_store: SharedStore | None = None
) -> Any:
    """The router's app as the replica builds it, on fake handles (one per model, shared by
    every region; the embedding's rows 384-wide and random, so encoding costs what it costs).
    `state`: gateway state, its ledger recording every request (None: state off);
    `cache_store`: the response cache's shared tier (None: in memory)."""
    handles = {name: _fake_handle(model.task) for name, model in config.models.items()}
    keys = KeyStore.from_env(
        {"EDGE_API_KEYS": f"bench:{USER_KEY}"},
        config.security,
        virtual=state.follower if state is not None else None,
    )
    # The access log is formatted and written, as in the replica, but to /dev/null.
    devnull = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives as long as the app
    observability = RouterObservability(
        config.observability,
        config.models,
        access_logger=configure_access_logger(stream=devnull, name="benchmarks.router_cpu"),
        ledger=state.ledger if state is not None else None,
    )
    # The rate limiter runs as it does for real, on a clock that refills every bucket between
    # requests, so the measurement never hits a 429.
    ticks = itertools.count()
    services = build_services(
        config,
        in_every_region(config, handles),
        keys=keys,
        observability=observability,
        clock=lambda: 3600.0 * next(ticks),
        state=state,
        cache_store=cache_store,
    )
    return make_app(config, services)


# ---- direct ASGI calls --------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    body: Callable[[int], dict[str, Any] | None]  # the request body of request number i

    def request(self, i: int) -> tuple[str, str, bytes]:
        body = self.body(i)
        return self.method, self.path, b"" if body is None else json.dumps(body).encode()


def _texts(i: int, count: int = 1) -> list[str]:
    # Distinct texts per request: the response cache misses, as it does for real clients.
    return [f"{SENTENCE} ({i}.{j})" for j in range(count)]


def endpoints(chat_model: str, embedding_model: str) -> dict[str, Endpoint]:
    return {
        "embeddings_float": Endpoint(
            "POST", "/v1/embeddings", lambda i: {"model": embedding_model, "input": _texts(i)[0]}
        ),
        "embeddings_base64": Endpoint(
            "POST",
            "/v1/embeddings",
            lambda i: {
                "model": embedding_model,
                "input": _texts(i)[0],
                "encoding_format": "base64",
            },
        ),
        "embeddings_float_x32": Endpoint(
            "POST", "/v1/embeddings", lambda i: {"model": embedding_model, "input": _texts(i, 32)}
        ),
        "workers_embedding": Endpoint(
            "POST", f"/ai/run/{embedding_model}", lambda i: {"text": _texts(i)}
        ),
        "moderations": Endpoint("POST", "/v1/moderations", lambda i: {"input": _texts(i)[0]}),
        "chat": Endpoint(
            "POST",
            "/v1/chat/completions",
            lambda i: {
                "model": chat_model,
                "messages": [{"role": "user", "content": f"What is the capital of France? {i}"}],
                "max_tokens": 16,
            },
        ),
        "models": Endpoint("GET", "/v1/models", lambda i: None),
    }


async def asgi_call(app: Any, method: str, path: str, body: bytes) -> tuple[int, bytes]:
    status, payload, _ = await asgi_exchange(app, method, path, body)
    return status, payload


async def asgi_exchange(
    app: Any, method: str, path: str, body: bytes
) -> tuple[int, bytes, dict[bytes, bytes]]:
    """`asgi_call`, with the response's headers."""
    headers = [
        (b"host", b"127.0.0.1:8000"),
        (b"authorization", f"Bearer {USER_KEY}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"user-agent", b"OpenAI/Python 1.0"),
        (b"x-request-id", b"0123456789abcdef"),
    ]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("10.0.0.7", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent = False

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.Event().wait()  # the client stays connected
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    status, chunks = 0, []
    answered: dict[bytes, bytes] = {}  # the response's headers

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            answered.update(message.get("headers", ()))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks), answered


def cpu_per_request_us(
    app: Any,
    endpoint: Endpoint,
    requests: int,
    rounds: int,
    loop: asyncio.AbstractEventLoop,
    after_round: Callable[[], Awaitable[Any]] | None = None,
) -> dict[str, Any]:
    """Process CPU time per request (µs), median and spread over `rounds` runs of `requests`
    sequential calls; the first response is checked, so a broken route cannot look fast.
    `after_round` runs inside each round's measured time (the ledger's queue written)."""
    status, payload = loop.run_until_complete(asgi_call(app, *endpoint.request(-1)))
    if status != 200:
        raise RuntimeError(f"{endpoint.path}: {status} {payload[:300]!r}")
    per_round = []
    counter = 0
    for _ in range(rounds):
        bodies = [endpoint.request(counter + i) for i in range(requests)]
        counter += requests

        async def drive(bodies: list[tuple[str, str, bytes]] = bodies) -> None:
            for request in bodies:
                await asgi_call(app, *request)
            if after_round is not None:
                await after_round()

        started = time.process_time()
        loop.run_until_complete(drive())
        per_round.append((time.process_time() - started) / requests * 1e6)
    return {
        "cpu_us_per_request": round(statistics.median(per_round), 1),
        "cpu_us_min": round(min(per_round), 1),
        "cpu_us_max": round(max(per_round), 1),
        "response_bytes": len(payload),
    }


def profile_endpoint(
    app: Any, endpoint: Endpoint, requests: int, loop: asyncio.AbstractEventLoop, top: int = 30
) -> str:
    bodies = [endpoint.request(i) for i in range(requests)]

    async def drive() -> None:
        for request in bodies:
            await asgi_call(app, *request)

    profiler = cProfile.Profile()
    profiler.enable()
    loop.run_until_complete(drive())
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# ---- the measurement ----------------------------------------------------------------------------


def measure_in_process(
    requests: int, rounds: int, serve_config: Path = PROJECT_ROOT / "serve_config.yaml"
) -> dict[str, Any]:
    """Every endpoint's CPU per request (see cpu_per_request_us) and the encoders compared."""
    config = app_config(serve_config=serve_config)
    app = bench_app(config)
    loop = asyncio.new_event_loop()
    try:
        measured = {
            name: cpu_per_request_us(app, endpoint, requests, rounds, loop)
            for name, endpoint in served_endpoints(config).items()
        }
    finally:
        loop.close()
    return {
        "dimension": DIMENSION,
        "requests_per_round": requests,
        "rounds": rounds,
        "endpoints": measured,
        "encoders": encoder_comparison(),
        "ledger": ledger_overhead(config, requests, rounds),
    }


LEDGER_ENDPOINTS = ("embeddings_float", "chat")


def ledger_overhead(config: AppConfig, requests: int, rounds: int) -> dict[str, Any]:
    """Router CPU per request with gateway state off, and on (SQLite in a temp dir, one ledger
    record per request, the queue written inside each round's measured time: its thread's CPU
    counts, process time is every thread's), rounds of the two alternated in one run; the
    ratio on/off per endpoint. The key is a configured one: no budget, no database wait."""
    loop = asyncio.new_event_loop()
    with tempfile.TemporaryDirectory(prefix="edge-bench-state-") as folder:
        database = SqliteDatabase(Path(folder) / "gateway.sqlite3")
        state = GatewayState.build(
            config.state, database, config.security, config.observability.prices
        )
        try:
            if not loop.run_until_complete(state.ensure_ready()):
                raise RuntimeError(f"the benchmark's SQLite store in {folder} did not open")
            apps = {"off": (bench_app(config), None), "on": (bench_app(config, state), state)}
            medians: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
            for _ in range(rounds):
                for side, (app, side_state) in apps.items():
                    flush = side_state.writer.flush_ready if side_state is not None else None
                    for name in LEDGER_ENDPOINTS:
                        endpoint = served_endpoints(config)[name]
                        figure = cpu_per_request_us(app, endpoint, requests, 1, loop, flush)
                        medians[side].setdefault(name, []).append(figure["cpu_us_per_request"])
            written = state.writer.written
        finally:
            loop.run_until_complete(database.close())
            loop.close()
    out: dict[str, Any] = {"records_written": written}
    for name in LEDGER_ENDPOINTS:
        off, on = (statistics.median(medians[side][name]) for side in ("off", "on"))
        out[name] = {
            "off_cpu_us": round(off, 1),
            "on_cpu_us": round(on, 1),
            "on_over_off": round(on / off, 3),
        }
    return out


def served_endpoints(config: AppConfig) -> dict[str, Endpoint]:
    chat_model = next(n for n, m in config.models.items() if m.task == "chat")
    embedding_model = next(n for n, m in config.models.items() if m.task == "embedding")
    return endpoints(chat_model, embedding_model)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.router_cpu.in_process", description=__doc__
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", metavar="ENDPOINT", help="print a cProfile of one endpoint")
    args = parser.parse_args()
    if not args.profile:
        print(json.dumps(measure_in_process(args.requests, args.rounds), indent=2))
        return
    config = app_config()
    app = bench_app(config)
    endpoint = served_endpoints(config)[args.profile]
    loop = asyncio.new_event_loop()
    cpu_per_request_us(app, endpoint, 50, 1, loop)  # warm up
    print(profile_endpoint(app, endpoint, args.requests, loop))


if __name__ == "__main__":
    main()
