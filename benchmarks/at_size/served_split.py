"""Where a served burst's time goes: the at-size GLM (fp32) served as the at-size suite serves it,
`--bursts` bursts of `--streams` requests at once (16) on one cluster; per burst its tokens/s,
the engine's side from the replica's own step profile (busy share of the burst, graph ms a step:
in process they are `step_profile`'s), and the cores each process of the cluster took meanwhile
(the replica, and everything else: Serve's controller, the routers, GCS, ...).

    python -m benchmarks.at_size.served_split --bursts 3
    python -m benchmarks.at_size.served_split --bursts 3 --streams 1 --threads 1

Writes one JSON document to stdout: the bursts and their medians. For the gap between the engine
in process and the same engine served, which the at-size suite's figures show but do not split.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ray import serve

from benchmarks.at_size.config import AtSizeBenchConfig, parse_tool_args, tool_parser
from benchmarks.at_size.load import chat_body, measure_side
from benchmarks.at_size.models import at_size_application
from benchmarks.at_size.suite import CHAT_PATH
from benchmarks.lib import processes
from benchmarks.lib.edge_app import BYPASS_CACHE, EDGE_APP, our_url
from benchmarks.lib.http_load import Endpoint, async_client, completion_tokens_at_once, ready
from benchmarks.lib.served import served

MODEL = "glm"
REPLICA_TITLE = f"ray::ServeReplica:{EDGE_APP}:{MODEL}"
LOAD = "this driver (the load)"
SHOWN_CORES = 0.005  # a process title under this share of a core is left out of the report

log = logging.getLogger(__name__)

CpuReading = tuple[dict[int, float], dict[int, str]]  # CPU seconds and title, by pid


def cpu_reading() -> CpuReading:
    """This driver and every process below it (the private cluster), never another's."""
    me = os.getpid()
    pids = [info.pid for info in processes.descendants(me, processes.processes())]
    titles = {pid: processes.process_title(pid) for pid in pids} | {me: LOAD}
    return processes.cpu_seconds_by_pid(titles), titles


def cores_between(
    before: CpuReading, after: CpuReading, wall_s: float, shown: float = SHOWN_CORES
) -> dict[str, float]:
    """Cores each process title took over `wall_s`, largest first: only processes in both
    readings (one started meanwhile would count its whole life: a new process under Serve's
    controller's title once counted 4.5 CPU-seconds in an 8 s burst)."""
    seconds_before, _ = before
    seconds_after, titles = after
    kept = {pid: seconds for pid, seconds in seconds_after.items() if pid in seconds_before}
    used = processes.cpu_used_by_title(seconds_before, kept, titles)
    return {
        title: round(seconds / wall_s, 3)
        for title, seconds in used.items()
        if seconds / wall_s >= shown
    }


def engine_between(
    before: Mapping[str, float], after: Mapping[str, float], wall_s: float
) -> dict[str, float]:
    """The replica's step profile (LLMRuntime.describe's `engine`) over a burst: its steps, the
    share of the burst it was stepping (busy) and running the graph, and the graph's ms a step."""
    steps = int(after["steps"] - before["steps"])
    graph_s = after["graph_s"] - before["graph_s"]
    return {
        "steps": steps,
        "busy_share": round((after["wall_s"] - before["wall_s"]) / wall_s, 3),
        "graph_share": round(graph_s / wall_s, 3),
        "graph_ms_per_step": round(graph_s / max(steps, 1) * 1000, 1),
    }


def split_burst(
    wall_s: float,
    tokens: int,
    engine: tuple[Mapping[str, float], Mapping[str, float]],
    cpu: tuple[CpuReading, CpuReading],
) -> dict[str, Any]:
    every = cores_between(*cpu, wall_s, shown=0.0)  # the sums count the small ones too
    replica = every.get(REPLICA_TITLE, 0.0)
    others = sum(share for title, share in every.items() if title not in (REPLICA_TITLE, LOAD))
    cores = {title: share for title, share in every.items() if share >= SHOWN_CORES}
    return {
        "tokens_per_s": round(tokens / wall_s, 1),
        "wall_s": round(wall_s, 3),
        "engine": engine_between(*engine, wall_s),
        "replica_cores": replica,
        "others_cores": round(others, 3),
        "cores": cores,
    }


async def _bursts(config: AtSizeBenchConfig, endpoint: Endpoint) -> list[dict[str, Any]]:
    clock = time.perf_counter
    replica = serve.get_deployment_handle(MODEL, app_name=EDGE_APP)
    bursts = []
    async with async_client(config.streams) as client:
        await ready(client, endpoint, chat_body(MODEL, 0, 2))
        await measure_side(config, client, endpoint, MODEL, -1000, clock)  # warm, as a suite
        for burst in range(config.runs):
            await asyncio.sleep(config.settle_s)
            bodies = [
                chat_body(MODEL, 1000 * (burst + 1) + 100 + i, config.max_tokens)
                for i in range(config.streams)
            ]
            cpu_before, engine_before = cpu_reading(), (await replica.describe.remote())
            wall_s, tokens = await completion_tokens_at_once(client, endpoint, bodies, clock)
            cpu_after, engine_after = cpu_reading(), (await replica.describe.remote())
            split = split_burst(
                wall_s,
                tokens,
                (engine_before["engine"], engine_after["engine"]),
                (cpu_before, cpu_after),
            )
            split["replica_pids"] = sorted({engine_before["pid"], engine_after["pid"]})
            log.info("burst %d: %s", burst, split)
            bursts.append(split)
    return bursts


def measure(config: AtSizeBenchConfig) -> list[dict[str, Any]]:
    with served(config, [at_size_application(config)]) as (base_url, _):
        endpoint = Endpoint(f"{our_url(config, base_url)}{CHAT_PATH}", BYPASS_CACHE)
        return asyncio.run(_bursts(config, endpoint))


def medians(bursts: list[dict[str, Any]]) -> dict[str, float]:
    def median(read: Any) -> float:
        return round(statistics.median(read(burst) for burst in bursts), 3)

    return {
        "tokens_per_s": median(lambda b: b["tokens_per_s"]),
        "engine_busy_share": median(lambda b: b["engine"]["busy_share"]),
        "graph_ms_per_step": median(lambda b: b["engine"]["graph_ms_per_step"]),
        "replica_cores": median(lambda b: b["replica_cores"]),
        "others_cores": median(lambda b: b["others_cores"]),
    }


def main() -> None:
    parser = tool_parser(__doc__)
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--streams", type=int, help="requests at once (default 16)")
    parser.add_argument("--threads", type=int, help="ONNX Runtime threads (default: every core)")
    parser.add_argument("--serve-config", type=Path, help="default: serve_config.yaml")
    args = parse_tool_args(parser)
    options = {"threads": args.threads, "streams": args.streams, "serve_config": args.serve_config}
    config = AtSizeBenchConfig(
        models_dir=args.models_dir.resolve(),
        at_size_dir=args.at_size_dir,
        models=[MODEL],
        runs=args.bursts,
        ttft_streams=1,
        **{name: value for name, value in options.items() if value is not None},
    )
    # Ray's chatter (a raylet's warnings reach the driver's stdout) would corrupt the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        bursts = measure(config)
    report = {"model": MODEL, "threads": config.threads, "median": medians(bursts)}
    print(json.dumps(report | {"bursts": bursts}, indent=2))


if __name__ == "__main__":
    main()
