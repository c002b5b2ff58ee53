"""Regions benchmark, one JSON in one run: the routing decision's cost (no Ray), then on a 3-node
Ray cluster on this machine (head = region eu + ingress, one node each for us and ap; see
edgectl.local_cluster), with the simulated RTT really slept:
- all warm: share of requests served from their nearest region; RTT added by routing over the
  nearest region's RTT (p50);
- cold-start avoidance: the first requests of a cold region's clients, detoured to a warm region
  (model `embedding`: eu warm) vs waiting on the cold start (a copy of it, `embedding_cold`, cold
  everywhere), p50 each;
- overload at 3x capacity from one city: share of sheds with Retry-After, regions ejected;
- region outage: the ap node killed under mixed load: failed requests, p99 before vs during.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import Field

from benchmarks.lib.config import BenchConfig
from benchmarks.lib.goals import GoalRecord, goal
from deployments.serve_file import serve_only, set_router_listener
from edge_sim.config import EdgeConfig
from edge_sim.regions import PoolView, plan_regions
from edgectl.loadtest.regions import CITY_PROBES
from edgectl.loadtest.summary import latency_stats

NEEDS_RAY = True  # a 3-node cluster; the routing decision's cost runs anywhere

REPO = Path(__file__).resolve().parent.parent
log = logging.getLogger(__name__)
ADMIN_KEY = "bench-admin-key"
LOAD_KEY = "sk-bench-load-0000"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
LOAD = {"authorization": f"Bearer {LOAD_KEY}"}
TIGHT = {"max_ongoing_requests": 2, "max_queued_requests": 4}  # moderation: capacity per region


class RegionsBenchConfig(BenchConfig):
    QUICK = {"rounds": 2, "phase_s": 8.0}

    rounds: int = Field(default=5, ge=1, description="all-warm rounds per city")
    phase_s: float = Field(default=20.0, gt=0, description="overload and outage phase length")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("regions suite")
    group.add_argument("--regions-rounds", type=int, help="all-warm rounds per city (default 5)")
    group.add_argument("--regions-phase-s", type=float, help="outage phase length (default 20)")


def decision_cost_us(repeat: int = 20_000) -> float:
    """One region plan (three regions, nearest cold, a warm neighbour): microseconds."""
    reachable = [("ap", 80.0), ("eu", 145.0), ("us", 168.0)]
    pools = {"ap": PoolView(0), "eu": PoolView(1), "us": PoolView(1, saturated=True)}
    seconds = timeit.timeit(
        lambda: plan_regions(reachable, pools, cold_start_ms=3000.0), number=repeat
    )
    return seconds / repeat * 1e6


def regions_serve_config(models_root: Path, http_port: int) -> dict[str, Any]:
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    config["http_options"] = {"host": "127.0.0.1", "port": http_port}
    app = config["applications"][0]
    args = app["args"]
    args["models_dir"] = str(models_root.resolve())
    set_router_listener(args, None)
    embedding = args["models"]["embedding"]
    args["models"] = {
        "embedding": embedding,
        # The same model, cold everywhere: the "waiting" case (its own name, no aliases).
        "embedding_cold": {**embedding, "aliases": []},
        "moderation": args["models"]["moderation"],
    }
    serve_only(args, args["models"])  # their prices; the gate is off without a chat model
    args["security"]["per_key"] = {
        "bench": {"requests_per_minute": None, "tokens_per_minute": None}
    }
    args["edge"]["region_policy"]["ingress_resource"] = "ingress"
    deployments = []
    initial = {
        "embedding": {"eu": 1, "us": 1, "ap": 1},
        "embedding_cold": {"eu": 0, "us": 0, "ap": 0},
        "moderation": {"eu": 1, "us": 1, "ap": 1},
    }
    template = {d["name"]: d for d in app["deployments"]}
    for model, regions in initial.items():
        source = "embedding" if model.startswith("embedding") else model
        for region, count in regions.items():
            deployment = yaml.safe_load(yaml.safe_dump(template[f"{source}-{region}"]))
            deployment["name"] = f"{model}-{region}"
            deployment["autoscaling_config"].update(
                max_replicas=1,
                initial_replicas=count,
                downscale_delay_s=600,
                downscale_to_zero_delay_s=600,
            )
            if model == "moderation":
                deployment.update(TIGHT)
            deployments.append(deployment)
    deployments.append(template["router"])
    app["deployments"] = deployments
    return config


async def _send(
    client: httpx.AsyncClient, city: str, model: str = "embedding"
) -> tuple[float, httpx.Response]:
    geo, _ = CITY_PROBES[city]
    path, body = (
        ("/v1/moderations", {"model": model, "input": [f"t{n}" for n in range(16)]})
        if model == "moderation"
        else ("/v1/embeddings", {"model": model, "input": f"hello from {city}"})
    )
    started = time.perf_counter()
    response = await client.post(
        path, json=body, headers={**LOAD, "x-client-geo": geo, "x-edge-cache": "bypass"}
    )
    return (time.perf_counter() - started) * 1000.0, response


async def all_warm(base_url: str, edge: EdgeConfig, rounds: int) -> dict[str, Any]:
    """Every city in `rounds` rounds; the RTT routing added = the served region's backhaul from
    the entry colo minus that of the colo's own (nearest) region."""
    regions = edge.region_map()
    served, added = [], []
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        for _ in range(rounds):
            for city, (_, region) in CITY_PROBES.items():
                _, response = await _send(client, city)
                colo, chosen = response.headers["x-edge-colo"], response.headers["x-edge-region"]
                backhaul = dict(regions.from_colo(colo))
                served.append(chosen == region)
                added.append(backhaul[chosen] - backhaul[regions.home(colo)])
    return {
        "requests": len(served),
        "nearest_share": sum(served) / len(served),
        "added_rtt_p50_ms": statistics.median(added),
        "added_rtt_max_ms": max(added),
    }


async def cold_start_avoidance(base_url: str, first: int = 5) -> dict[str, Any]:
    """`first` simultaneous requests from Tokyo: `embedding` (ap cold, eu warm -> detour) and
    `embedding_cold` (cold everywhere -> they wait for ap's replica)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
        detour = await asyncio.gather(*(_send(client, "tokyo") for _ in range(first)))
        waiting = await asyncio.gather(
            *(_send(client, "tokyo", "embedding_cold") for _ in range(first))
        )
    detour_ms = [ms for ms, _ in detour]
    wait_ms = [ms for ms, _ in waiting]
    return {
        "requests_each": first,
        "detour_p50_ms": statistics.median(detour_ms),
        "detour_regions": sorted({r.headers.get("x-edge-region", "?") for _, r in detour}),
        "detour_reasons": sorted({r.headers.get("x-edge-route-reason", "?") for _, r in detour}),
        "wait_p50_ms": statistics.median(wait_ms),
        "wait_cold_start": sorted({r.headers.get("x-edge-cold-start", "?") for _, r in waiting}),
        "detour_vs_wait_p50": statistics.median(detour_ms) / statistics.median(wait_ms),
    }


async def overload(base_url: str, seconds: float) -> dict[str, Any]:
    """From Frankfurt, 3x what the three moderation pools hold (running + queued)."""
    capacity = 3 * (TIGHT["max_ongoing_requests"] + TIGHT["max_queued_requests"])
    answers: list[httpx.Response] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        loop = asyncio.get_running_loop()
        stop_at = loop.time() + seconds

        async def worker() -> None:
            while loop.time() < stop_at:
                answers.append((await _send(client, "frankfurt", "moderation"))[1])

        await asyncio.gather(*(worker() for _ in range(3 * capacity)))
        regions = (await client.get("/admin/regions", headers=ADMIN)).json()
    shed = [r for r in answers if r.status_code in (429, 503)]
    ejected = sum(
        1
        for region in regions
        for state in region["models"].values()
        if state["health"]["state"] != "healthy" or state["health"]["ejections"]
    )
    return {
        "concurrency": 3 * capacity,
        "requests": len(answers),
        "answered": sum(r.status_code == 200 for r in answers),
        "shed_share": len(shed) / len(answers) if answers else None,
        "shed_with_retry_after_share": (
            sum("retry-after" in r.headers for r in shed) / len(shed) if shed else None
        ),
        "other_statuses": sorted({r.status_code for r in answers} - {200, 429, 503}),
        "regions_ejected": ejected,
        "back_pressure_events": sum(r["models"]["moderation"]["back_pressure"] for r in regions),
    }


async def outage(base_url: str, cluster: Any, phase_s: float) -> dict[str, Any]:
    """Mixed cities, one request after another per city; the ap node killed mid-run."""
    rows: list[tuple[float, str, int, str | None, float]] = []
    stop = asyncio.Event()

    async def city_client(client: httpx.AsyncClient, city: str) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            try:
                ms, response = await _send(client, city)
                rows.append(
                    (sent, city, response.status_code, response.headers.get("x-edge-region"), ms)
                )
            except httpx.HTTPError:
                rows.append((sent, city, 0, None, (time.monotonic() - sent) * 1000))
            await asyncio.sleep(0.1)

    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        tasks = [asyncio.create_task(city_client(client, city)) for city in CITY_PROBES]
        await asyncio.sleep(phase_s)
        (ap,) = [node for node in cluster.nodes if node.name == "ap"]
        killed_at = time.monotonic()
        await asyncio.to_thread(cluster.kill_node, ap)
        await asyncio.sleep(phase_s)
        stop.set()
        await asyncio.gather(*tasks)
    before = latency_stats(ms for sent, *_, ms in rows if sent < killed_at)
    during = latency_stats(ms for sent, *_, ms in rows if sent >= killed_at)
    tokyo_after = [
        region for sent, city, _, region, _ in rows if city == "tokyo" and sent >= killed_at
    ]
    return {
        "requests": len(rows),
        "failed": sum(1 for _, _, status, _, _ in rows if status != 200),
        "p99_before_ms": before["p99"],
        "p99_during_ms": during["p99"],
        "p50_before_ms": before["p50"],
        "p50_during_ms": during["p50"],
        "tokyo_regions_during": sorted({r for r in tokyo_after if r}),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    given = {"rounds": args.regions_rounds, "phase_s": args.regions_phase_s}
    config = RegionsBenchConfig.from_args(args, **{k: v for k, v in given.items() if v is not None})
    return run_regions_suite(config)


def run_regions_suite(config: RegionsBenchConfig) -> dict[str, Any]:
    from edgectl.local_cluster import LocalCluster, free_port, wait_until

    result: dict[str, Any] = {
        "config": config.model_dump(mode="json"),
        "decision_cost_us": decision_cost_us(),
    }
    root = Path(tempfile.mkdtemp(prefix="bench-regions-"))
    env = {
        "EDGE_ADMIN_KEY": ADMIN_KEY,
        "EDGE_API_KEYS": f"bench:{LOAD_KEY}",
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_failure_threshold": "3",
    }
    cluster = LocalCluster.start(num_cpus=2, resources={"region:eu": 100, "ingress": 100}, env=env)
    phase = "cluster"
    try:
        for region in ("us", "ap"):
            cluster.add_node(region, num_cpus=1, resources={f"region:{region}": 100})
        port = free_port()
        config_file = regions_serve_config(config.models_dir, port)
        (root / "serve.yaml").write_text(yaml.safe_dump(config_file, sort_keys=False))
        cluster.cli("serve", "deploy", str(root / "serve.yaml"))
        base_url = f"http://127.0.0.1:{port}"

        def status() -> dict[str, Any]:
            return dict(yaml.safe_load(cluster.cli("serve", "status"))["applications"]["edge"])

        wait_until(lambda: status()["status"] == "RUNNING", 600, "the app RUNNING", every_s=2)
        edge = EdgeConfig.from_mapping(config_file["applications"][0]["args"]["edge"])
        phase = "all_warm"
        log.info("regions: all warm, %d rounds", config.rounds)
        result["all_warm"] = asyncio.run(all_warm(base_url, edge, config.rounds))
        # The detour case needs ap cold for `embedding`: redeploy it at zero there.
        ap = next(
            d for d in config_file["applications"][0]["deployments"] if d["name"] == "embedding-ap"
        )
        ap["autoscaling_config"]["initial_replicas"] = 0
        ap["autoscaling_config"]["downscale_delay_s"] = 1
        ap["autoscaling_config"]["downscale_to_zero_delay_s"] = 1
        (root / "serve.yaml").write_text(yaml.safe_dump(config_file, sort_keys=False))
        cluster.cli("serve", "deploy", str(root / "serve.yaml"))

        def ap_at_zero() -> bool:
            states = status()["deployments"]["embedding-ap"]["replica_states"]
            return not states.get("RUNNING") and not states.get("STARTING")

        phase = "cold_start_avoidance"
        wait_until(ap_at_zero, 300, "embedding-ap at zero", every_s=2)
        time.sleep(2)  # the routers' shared state follows within a second
        log.info("regions: cold-start avoidance")
        result["cold_start_avoidance"] = asyncio.run(cold_start_avoidance(base_url))
        phase = "overload_3x"
        log.info("regions: overload")
        result["overload_3x"] = asyncio.run(overload(base_url, config.phase_s))
        # ap held up for the outage (the cold-start case let it go back to zero at once).
        ap["autoscaling_config"].update(
            min_replicas=1, initial_replicas=1, downscale_delay_s=600, downscale_to_zero_delay_s=600
        )
        (root / "serve.yaml").write_text(yaml.safe_dump(config_file, sort_keys=False))
        cluster.cli("serve", "deploy", str(root / "serve.yaml"))
        wait_until(
            lambda: status()["deployments"]["embedding-ap"]["replica_states"].get("RUNNING"),
            300,
            "embedding-ap running",
            every_s=2,
        )
        phase = "region_outage"
        log.info("regions: outage")
        result["region_outage"] = asyncio.run(outage(base_url, cluster, config.phase_s))
    except Exception as exc:  # noqa: BLE001 - what was measured is kept, the failure named
        log.exception("regions: %s failed", phase)
        result["error"] = f"{phase}: {type(exc).__name__}: {exc}"
    finally:
        cluster.stop()
    result["goals"] = goals(result)
    log.info("regions: %s", json.dumps(result))  # on stderr too: a long run is never lost
    return result


def goals(result: dict[str, Any]) -> dict[str, GoalRecord]:
    warm = result.get("all_warm", {})
    cold = result.get("cold_start_avoidance", {})
    outage_run = result.get("region_outage", {})
    overload_run = result.get("overload_3x", {})
    return {
        "all_warm_nearest_share": goal(
            warm.get("nearest_share"), 1.0, "share served by the nearest region"
        ),
        "all_warm_added_rtt_p50_ms": goal(
            warm.get("added_rtt_p50_ms"), 1.0, "ms over the nearest region's RTT", at_most=True
        ),
        "cold_detour_vs_wait_p50": goal(
            cold.get("detour_vs_wait_p50"), 0.5, "detour p50 / waiting p50", at_most=True
        ),
        "outage_failed_requests": goal(outage_run.get("failed"), 0, "requests", at_most=True),
        "overload_regions_ejected": goal(
            overload_run.get("regions_ejected"), 0, "(region, model) pools", at_most=True
        ),
        "overload_sheds_with_retry_after": goal(
            overload_run.get("shed_with_retry_after_share"), 1.0, "share of 503/429"
        ),
    }
