"""Edge benchmarks: the router's routing decision cost with 300 colos (no Ray), and a failover
drill against our own cluster: the load tester's colo-outage scenario (steady open-loop load, the
home colo down mid-run, then recovery)."""

from __future__ import annotations

import argparse
import random
import sys
import timeit
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import Field
from ray import serve

from benchmarks.lib.cluster import serve_cluster
from benchmarks.lib.config import BenchConfig
from benchmarks.lib.goals import GoalRecord, goal
from deployments.app import build_app
from deployments.config import PROJECT_ROOT
from deployments.serve_file import set_router_listener
from edge_sim.clock import ManualClock
from edge_sim.config import EdgeConfig
from edge_sim.geo import CountryCentroids
from edge_sim.network import EdgeNetwork
from edgectl.loadtest.records import RequestRecord
from edgectl.loadtest.regions import region_named
from edgectl.loadtest.runner import LoadRunner, RunSettings
from edgectl.loadtest.scenarios import ModelTarget, ScenarioConfig, build_schedule
from edgectl.loadtest.summary import latency_stats, phase_of
from edgectl.local_cluster import free_port

NEEDS_RAY = True  # the failover drill; the routing decision's cost runs anywhere

DECISION_GOAL_US = 50.0
SLACK_MS = 50.0
ADMIN_KEY = "bench-admin-key"
CLIENT_REGION = "eu-west"  # London


class EdgeBenchConfig(BenchConfig):
    QUICK = {"decision_repetitions": 2_000, "phase_s": 4.0}

    decision_repetitions: int = Field(default=20_000, ge=1)
    rate_rps: float = Field(default=40.0, gt=0, description="drill requests/s")
    phase_s: float = Field(default=10.0, gt=0, description="drill phase length")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("edge suite")
    group.add_argument("--edge-rate", type=float, help="drill requests/s (default 40)")
    group.add_argument("--edge-phase-s", type=float, help="drill phase length (default 10)")


def _colo_id(i: int) -> str:
    return "".join(chr(65 + (i // 26**k) % 26) for k in range(3))


def decision_cost_us(n_colos: int = 300, repeat: int = 20_000) -> dict[str, float]:
    rng = random.Random(7)
    colos = [
        {
            "id": _colo_id(i),
            "city": f"city {i}",
            "country": "US",
            "lat": rng.uniform(-60, 70),
            "lon": rng.uniform(-180, 180),
        }
        for i in range(n_colos)
    ]
    network = EdgeNetwork(
        EdgeConfig.model_validate({"topology": {"colos": colos}}),
        clock=ManualClock(),
        centroids=CountryCentroids.from_countryinfo(),
    )
    by_header = {"x-client-geo": "48.85,2.35"}
    by_country = {"cf-ipcountry": "FR"}

    def per_call(fn, n: int = repeat) -> float:
        return min(timeit.repeat(fn, number=n, repeat=3)) / n * 1e6

    return {
        "colos": n_colos,
        "route_geo_header_us": per_call(lambda: network.route("m", by_header)),
        "route_country_us": per_call(lambda: network.route("m", by_country)),
    }


def failover_drill(rate: float, phase_s: float, models_dir: Path) -> dict[str, Any]:
    """The load tester's colo-outage scenario from London against our own cluster: the home
    colo goes down for the middle third of the run; traffic must move without a failure."""
    config = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())["applications"][0]
    args = config["args"]
    args["models_dir"] = str(models_dir)
    args["accelerator"] = "cpu"
    args["edge"].pop("regions", None)  # a colo drill on one pool per model
    set_router_listener(args, None)
    http_port = free_port()
    base_url = f"http://127.0.0.1:{http_port}"
    # The admin key reaches the router replica through the cluster's environment.
    with serve_cluster(num_cpus=4, http_port=http_port, env={"EDGE_ADMIN_KEY": ADMIN_KEY}):
        serve.run(build_app(args), name="edge", route_prefix="/")
        region = region_named(CLIENT_REGION)
        home = httpx.post(
            f"{base_url}/v1/moderations",
            json={"input": "x"},
            headers={"x-client-geo": region.geo_header},
            timeout=120,
        ).headers["x-edge-colo"]
        scenario = ScenarioConfig(
            scenario="colo-outage",
            models=(ModelTarget(name="moderation", task="moderation"),),
            rate_rps=rate,
            duration_s=3 * phase_s,
            workers_api_share=0.0,
            region=CLIENT_REGION,
            fault_colo=home,
            outage_start_s=phase_s,
            outage_s=phase_s,
        )
        settings = RunSettings(base_url=base_url, request_timeout_s=60, admin_key=ADMIN_KEY)
        result = LoadRunner(settings).run(build_schedule(scenario))
    by_phase: dict[str, list[RequestRecord]] = {}
    for record in result.records:
        by_phase.setdefault(phase_of(record.scheduled_s, result.schedule.phases), []).append(record)
    out: dict[str, Any] = {"home_colo": home}
    for phase in ("before", "outage", "after"):
        rows = by_phase.get(phase, [])
        latency = latency_stats(r.latency_ms for r in rows if r.ok)
        out[phase] = {
            "requests": len(rows),
            "rps": len(rows) / phase_s,
            "failed": sum(1 for r in rows if not r.ok),
            "p50_ms": latency["p50"],
            "p99_ms": latency["p99"],
            "colos": sorted({r.edge.colo for r in rows if r.edge.colo}),
        }
    fallback = [c for c in out["outage"]["colos"] if c != home]
    out["fallback_colo"] = fallback[0] if fallback else None
    # The fallback colo's extra RTT from the clients, from the same latency model the router uses.
    network = EdgeNetwork(EdgeConfig.model_validate(args.get("edge", {})))
    plan = network.route("moderation", {"x-client-geo": region.geo_header})
    rtt = {c.colo_id: c.rtt_ms for c in plan.candidates}
    extra = rtt.get(out["fallback_colo"], 0.0) - rtt.get(home, 0.0)
    p99_before = out["before"]["p99_ms"]
    out["extra_rtt_ms"] = extra
    out["failed_total"] = sum(out[p]["failed"] for p in ("before", "outage", "after"))
    out["p99_bound_ms"] = None if p99_before is None else p99_before + extra + SLACK_MS
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    given = {"rate_rps": args.edge_rate, "phase_s": args.edge_phase_s}
    config = EdgeBenchConfig.from_args(args, **{k: v for k, v in given.items() if v is not None})
    decision = decision_cost_us(repeat=config.decision_repetitions)
    print(f"edge: routing decision {decision}", file=sys.stderr)
    drill = failover_drill(config.rate_rps, config.phase_s, config.models_dir)
    return {
        "config": config.model_dump(mode="json"),
        "decision_cost": decision,
        "failover_drill": drill,
        "goals": goals(decision, drill),
    }


def goals(decision: dict[str, Any], drill: dict[str, Any]) -> dict[str, GoalRecord]:
    return {
        "routing_decision_us_300_colos": goal(
            decision["route_geo_header_us"], DECISION_GOAL_US, "us", at_most=True
        ),
        "failover_drill_p99_during_outage": goal(
            drill["outage"]["p99_ms"] if drill["p99_bound_ms"] is not None else None,
            drill["p99_bound_ms"] or 0.0,
            "ms",
            at_most=True,
            missing="no p99 before the outage, so no bound",
            note="p99 before + the fallback colo's extra RTT + 50 ms",
        ),
        "failover_drill_failed_requests": goal(drill["failed_total"], 0, "requests", at_most=True),
    }
