"""`edge loadtest SCENARIO --url URL --out DIR` (or `python -m edgectl.loadtest --scenario ...`):
plan a scenario against the running router (its models, its colos, the config's scale-to-zero
delay), run it, write reports."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import ValidationError

from edge_sim.clock import Clock
from edge_sim.faults import ColoFault
from edge_sim.geo import haversine_km
from edgectl.loadtest.progress import NoProgress, ProgressView, RichProgress
from edgectl.loadtest.regions import DEFAULT_REGION, DEFAULT_REGIONS, region_named
from edgectl.loadtest.replicas import ReplicaSampler, StatusReader
from edgectl.loadtest.report import REPORT_MD, write_outputs
from edgectl.loadtest.runner import LoadRunner, RunSettings
from edgectl.loadtest.scenarios import SCENARIOS, ModelTarget, ScenarioConfig, build_schedule
from edgectl.loadtest.workload import WorkloadSettings
from edgectl.serve_state import (
    DEFAULT_APP,
    ServeDashboard,
    default_dashboard,
    scale_to_zero_delays_s,
)

# Beyond the autoscaler's delay, the last replica still has to drain and stop.
IDLE_MARGIN_S = 15.0
DISCOVERY_TIMEOUT_S = 10.0


class UsageError(Exception):
    """A run that cannot start as asked; the message says what to pass instead (exit 2)."""


def build_parser(prog: str = "python -m edgectl.loadtest") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Open-loop load test of the ray-edge-ai router, with a report.",
    )
    add = parser.add_argument
    add("--scenario", required=True, choices=SCENARIOS, help="what traffic to send")
    add("--url", default="http://127.0.0.1:8000", help="the router (default: %(default)s)")
    add("--out", type=Path, help="output folder (default: reports/<scenario>)")
    add(
        "--rate",
        type=float,
        default=2.0,
        help="requests/s (ramp: final rate; burst: its rate; diurnal: at every region's peak)",
    )
    add("--duration-s", type=float, default=60.0, help="traffic time (burst: the burst's length)")
    add("--max-requests", type=int, help="send at most this many")
    add("--seed", type=int, default=0)
    add("--models", help="comma-separated model names (default: all of GET /v1/models)")
    add("--workers-share", type=float, default=0.1, help="share of requests to /ai/run/{model}")
    add("--max-tokens", type=int, default=32, help="chat completion length")
    add(
        "--cache",
        choices=("bypass", "allow"),
        default="bypass",
        help="the router's response cache: bypass it to load the models (default), or allow it",
    )
    add(
        "--region",
        default=DEFAULT_REGION,
        help=f"client region outside geo-mix: {', '.join(r.name for r in DEFAULT_REGIONS)}",
    )
    add("--ramp-start-rate", type=float, help="ramp: starting requests/s (default: rate / 10)")
    add(
        "--idle-s",
        type=float,
        help="burst-after-idle: silent gap (default: the models' scale-to-zero delay in "
        f"--serve-config + {IDLE_MARGIN_S:g} s)",
    )
    add("--warm-s", type=float, default=2.0, help="burst-after-idle: priming phase before idle")
    add("--day-s", type=float, default=86_400.0, help="diurnal: a day's length (compressed)")
    add("--trough", type=float, default=0.05, help="diurnal: the night's rate over the peak's")
    add("--serve-config", type=Path, default=Path("serve_config.yaml"))
    add("--fault-colo", help="colo-outage: colo to fault (default: nearest to --region)")
    add("--fault-region", help="region-outage: the region to drill (eu, us, ap, ...)")
    add("--fault", default='{"down": true}', help="*-outage: the fault, as ColoFault JSON")
    add("--outage-start-s", type=float, help="colo-outage: when (default: duration / 3)")
    add("--outage-s", type=float, help="colo-outage: how long (default: duration / 3)")
    add(
        "--admin-key",
        default=os.environ.get("EDGE_ADMIN_KEY"),
        help="bearer key of /admin (default: $EDGE_ADMIN_KEY)",
    )
    add("--api-key", help="bearer key sent with inference requests (if the router wants one)")
    add("--request-timeout-s", type=float, default=120.0)
    add(
        "--drain-timeout-s",
        type=float,
        help="wait after the last send (default: request timeout + 1 s)",
    )
    add("--no-replicas", action="store_true", help="do not sample Serve's replicas")
    add("--replicas-every-s", type=float, default=2.0)
    add(
        "--dashboard",
        default=default_dashboard(),
        help="Ray dashboard whose REST API gives the replica counts (default: "
        "$RAY_DASHBOARD_ADDRESS or %(default)s); token from RAY_AUTH_TOKEN[_PATH]",
    )
    add("--app", default=DEFAULT_APP, help="Serve application name (default: %(default)s)")
    add("--no-progress", action="store_true", help="no progress bar (off anyway without a TTY)")
    return parser


async def fetch_models(client: httpx.AsyncClient) -> list[ModelTarget]:
    response = await client.get("/v1/models")
    response.raise_for_status()
    return [ModelTarget(name=m["id"], task=m["task"]) for m in response.json()["data"]]


async def fetch_colos(client: httpx.AsyncClient, admin_key: str | None) -> list[dict[str, Any]]:
    headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
    response = await client.get("/admin/colos", headers=headers)
    response.raise_for_status()
    colos = response.json()
    return colos if isinstance(colos, list) else colos.get("colos", [])


def nearest_colo(colos: Sequence[dict[str, Any]], lat: float, lon: float, models: list[str]) -> str:
    """The healthy colo nearest to (lat, lon) that serves every given model."""
    serving = [
        c
        for c in colos
        if c.get("healthy", True) and (c.get("models") == "*" or set(models) <= set(c["models"]))
    ]
    if not serving:
        raise UsageError("no healthy colo serves these models; pass --fault-colo")
    return min(serving, key=lambda c: haversine_km(lat, lon, c["lat"], c["lon"]))["id"]


def default_idle_s(serve_config: Path, models: list[str], app: str) -> float:
    try:
        config = yaml.safe_load(serve_config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"{serve_config} not found: pass --idle-s or --serve-config") from None
    delays = scale_to_zero_delays_s(config, models, app)
    known = [d for d in delays.values() if d is not None]
    if not known:
        raise UsageError(
            f"no chosen model scales to zero in {serve_config} (min_replicas 0): pass --idle-s"
        )
    return max(known) + IDLE_MARGIN_S


async def plan(
    args: argparse.Namespace, transport: httpx.AsyncBaseTransport | None
) -> ScenarioConfig:
    """The scenario as the running router and the config file define it."""
    # /v1/models needs the API key when the router has keys configured.
    auth = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(
        base_url=args.url,
        transport=transport,
        timeout=DISCOVERY_TIMEOUT_S,
        trust_env=False,
        headers=auth,
    ) as client:
        try:
            served = await fetch_models(client)
        except (httpx.HTTPError, KeyError, ValueError) as error:
            raise UsageError(f"cannot list models at {args.url}/v1/models: {error}") from None
        models = served
        if args.models:
            wanted = [name.strip() for name in args.models.split(",") if name.strip()]
            by_name = {m.name: m for m in served}
            unknown = [name for name in wanted if name not in by_name]
            if unknown:
                raise UsageError(f"unknown models {unknown}; served: {sorted(by_name)}")
            models = [by_name[name] for name in wanted]
        names = [m.name for m in models]
        fields: dict[str, Any] = {}
        if args.scenario == "burst-after-idle":
            fields["idle_s"] = (
                args.idle_s
                if args.idle_s is not None
                else default_idle_s(args.serve_config, names, args.app)
            )
        if args.scenario == "diurnal":
            fields |= {"day_s": args.day_s, "trough_ratio": args.trough}
        if args.scenario == "region-outage":
            if not args.admin_key:
                raise UsageError(
                    "region-outage calls the admin API: pass --admin-key or set EDGE_ADMIN_KEY"
                )
            if not args.fault_region:
                raise UsageError("region-outage needs --fault-region (a region of the config)")
            fields |= {
                "fault_region": args.fault_region,
                "outage_fault": ColoFault.model_validate_json(args.fault),
                "outage_start_s": args.outage_start_s,
                "outage_s": args.outage_s,
            }
        if args.scenario == "colo-outage":
            if not args.admin_key:
                raise UsageError(
                    "colo-outage calls the admin API: pass --admin-key or set EDGE_ADMIN_KEY"
                )
            fault_colo = args.fault_colo
            if fault_colo is None:
                region = region_named(args.region)
                try:
                    colos = await fetch_colos(client, args.admin_key)
                except (httpx.HTTPError, ValueError) as error:
                    raise UsageError(
                        f"cannot read /admin/colos ({error}); pass --fault-colo"
                    ) from None
                fault_colo = nearest_colo(colos, region.lat, region.lon, names)
            fields |= {
                "fault_colo": fault_colo,
                "outage_fault": ColoFault.model_validate_json(args.fault),
                "outage_start_s": args.outage_start_s,
                "outage_s": args.outage_s,
            }
    return ScenarioConfig(
        scenario=args.scenario,
        models=tuple(models),
        rate_rps=args.rate,
        duration_s=args.duration_s,
        max_requests=args.max_requests,
        seed=args.seed,
        workers_api_share=args.workers_share,
        region=args.region,
        ramp_start_rps=args.ramp_start_rate,
        warm_s=args.warm_s,
        **fields,
    )


def main(
    argv: Sequence[str] | None = None,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    read_status: StatusReader | None = None,
    progress: ProgressView | None = None,
    prog: str = "python -m edgectl.loadtest",
    clock: Clock = time.monotonic,
) -> int:
    """Exit status: 0 when the run completed (failed requests are data, not a failure), 2 when
    it could not start, 130 when interrupted (the partial report is still written). `clock`
    times the run and its replica samples (a test's fake clock)."""
    args = build_parser(prog).parse_args(argv)
    out: Path = args.out or Path("reports") / args.scenario
    try:
        region_named(args.region)
        config = asyncio.run(plan(args, transport))
    except (UsageError, ValueError) as error:  # pydantic's ValidationError is a ValueError
        message = str(error) if not isinstance(error, ValidationError) else _short(error)
        print(f"loadtest: {message}", file=sys.stderr)
        return 2
    schedule = build_schedule(config)
    print(
        f"loadtest: {config.scenario}: {len(schedule.arrivals)} requests to "
        f"{', '.join(m.name for m in config.models)} over {schedule.end_s:.0f} s -> {out}",
        file=sys.stderr,
    )
    sampler = None
    if not args.no_replicas:
        if read_status is None:
            read_status = ServeDashboard(args.dashboard, app=args.app)
        sampler = ReplicaSampler(
            read_status,
            every_s=args.replicas_every_s,
            deployments=[m.name for m in config.models],
            clock=clock,
        )
    settings = RunSettings(
        base_url=args.url,
        request_timeout_s=args.request_timeout_s,
        drain_timeout_s=args.drain_timeout_s,
        admin_key=args.admin_key,
        run_id=out.name or "loadgen",
        workload=WorkloadSettings(
            max_tokens=args.max_tokens, api_key=args.api_key, cache=args.cache
        ),
    )
    if progress is None:
        # A bar redrawn into a log file or a pipe is noise: only a terminal gets one.
        show = not args.no_progress and sys.stderr.isatty()
        progress = RichProgress() if show else NoProgress()
    runner = LoadRunner(
        settings, transport=transport, sampler=sampler, progress=progress, clock=clock
    )
    result = runner.run(schedule)
    params = {
        **config.model_dump(mode="json"),
        "url": args.url,
        "max_tokens": args.max_tokens,
        "cache": args.cache,
        "request_timeout_s": args.request_timeout_s,
        "replica_sampling": not args.no_replicas,
    }
    summary = write_outputs(result, out, params)
    latency = summary["overall"]["latency_ms"]
    print(
        f"loadtest: {summary['requests']['ok']} ok, {summary['requests']['errors']} failed, "
        f"p50 {latency['p50']} ms, p99 {latency['p99']} ms, "
        f"{summary['cold_start']['count']} cold starts; report: {out / REPORT_MD}",
        file=sys.stderr,
    )
    return 130 if result.interrupted else 0  # 130: the shell's code for Ctrl-C


def _short(error: ValidationError) -> str:
    """One `field: problem` per error, without pydantic's URLs."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'config'}: {e['msg']}"
        for e in error.errors(include_url=False)
    )
