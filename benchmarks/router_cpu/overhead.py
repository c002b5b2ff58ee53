"""x-edge-overhead-ms measured as the gateway suite does (warm embeddings, a text of its own each,
one at a time) on the router's app in process (benchmarks.router_cpu.in_process) with the shipped
response cache and gateway state (SQLite files in a temp data_dir): the router's own time
without Ray or a socket.

`python -m benchmarks.router_cpu.overhead --requests 300`
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.lib.fake_handles import app_config
from benchmarks.router_cpu.in_process import (
    Endpoint,
    asgi_exchange,
    bench_app,
    served_endpoints,
)
from deployments.config import PROJECT_ROOT, AppConfig
from deployments.ingress.cache import open_cache_store
from deployments.ingress.state.gateway import GatewayState
from deployments.ingress.state.sqlite import SqliteDatabase
from deployments.observability.edge_overhead import OVERHEAD_HEADER
from edgectl.loadtest.summary import latency_stats

# Between two requests: the client's turn, in which the work an answer left behind it runs (the
# cache's write), as it does between a real client's requests.
CLIENT_TURN_S = 0.002


def edge_overhead_ms(
    requests: int, serve_config: Path = PROJECT_ROOT / "serve_config.yaml"
) -> dict[str, Any]:
    """x-edge-overhead-ms of warm embeddings requests one at a time, each a text of its own (a
    cache miss: a hit calls no model and has no overhead), on the shipped config's response
    cache and gateway state (SQLite under a temp data_dir, its background work running, as in
    the replica), after `requests` // 5 to warm up."""
    warmup = requests // 5
    with tempfile.TemporaryDirectory(prefix="edge-bench-overhead-") as folder:
        config = app_config(serve_config=serve_config).model_copy(update={"data_dir": folder})
        overheads = asyncio.run(_overheads(config, warmup + requests))
    return {"requests": requests, "overhead_ms": latency_stats(overheads[warmup:])}


async def _overheads(config: AppConfig, requests: int) -> list[float]:
    database = SqliteDatabase(config.data_path(config.state.sqlite_file))
    state = GatewayState.build(config.state, database, config.security, config.observability.prices)
    if not await state.ensure_ready():
        raise RuntimeError(f"the benchmark's SQLite store in {config.data_dir} did not open")
    state.start()
    try:
        app = bench_app(config, state, open_cache_store(config, {}))
        return await _overheads_of(app, served_endpoints(config)["embeddings_float"], requests)
    finally:
        await state.close()


async def _overheads_of(app: Any, endpoint: Endpoint, requests: int) -> list[float]:
    overheads = []
    for i in range(requests):
        status, payload, headers = await asgi_exchange(app, *endpoint.request(i))
        if status != 200 or OVERHEAD_HEADER.encode() not in headers:
            raise RuntimeError(f"{endpoint.path}: {status} {payload[:300]!r}")
        overheads.append(float(headers[OVERHEAD_HEADER.encode()]))
        await asyncio.sleep(CLIENT_TURN_S)
    return overheads


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.router_cpu.overhead", description=__doc__
    )
    parser.add_argument("--requests", type=int, default=400, help="measured, after a fifth more")
    print(json.dumps(edge_overhead_ms(parser.parse_args().requests), indent=2))


if __name__ == "__main__":
    main()
