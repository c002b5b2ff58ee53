"""`edge plan`: replay a day (or any trace) of the edge offline and report what it costs."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from deployments.config import ConfigError
from edge_sim.faults import ColoFault
from edge_sim.plan.policies import (
    Policy,
    always_warm,
    compare,
    keep_warm_hours,
    predictive,
    scale_to_zero,
)
from edge_sim.plan.settings import (
    COLD_START_NO_WARM_POOL_S,
    COLD_START_S,
    SERVICE_MS,
    RegionOutage,
)
from edge_sim.plan.trace import Burst, TraceSpec, generate
from edge_sim.plan.world import World, synthetic_world
from edge_sim.validation import EdgeConfigError
from edgectl.plan.config import KeepWarmFloor, ServePlanConfig, load_serve_config
from edgectl.plan.report import REPORT_MD, replay_line, write_plan_report
from edgectl.plan.sources import replay_source, source_names
from edgectl.plan.sources.scope import Replay, SourceScope, shown

EXAMPLE = """\
worked example (a day of 1M requests over 300 colos and 20 regions, a region down for an hour
at noon, the shipped autoscaling against two alternatives):

  edge plan --colos 300 --regions 20 --requests 1000000 --trace diurnal \\
      --outage ams:43200:3600 --policy config --policy zero:900 --policy min:1 --out plan-out
  # plan-out/report.md: per region and model requests, p50/p99 with RTT, cold-start share,
  # replicas over time, replica-seconds and cost units, sheds; one row per policy on the trace

pre-warming on the shipped 3 regions, two days of office-hours traffic, figures from day two:

  edge plan --trace follow-the-sun --hours 48 --measure-from-h 24 --requests 40000 \\
      --trough 0 --policy config --policy predictive --policy min:1 --out prewarm-out

a colo drill (the admin API's fault JSON): FRA down for an hour at noon, AMS 80 ms slower:

  edge plan --colo-fault 'FRA:{"down": true, "start_after_s": 43200, "duration_s": 3600}' \\
      --colo-fault 'AMS:{"added_latency_ms": 80}' --policy config --out drill-out

the gateway's own traffic, a copy of a router's request log (or postgresql://... of the shared
database), a working day of it:

  edge plan --trace request-log:gateway.sqlite3 --since 2026-12-01T08:00 \\
      --until 2026-12-01T18:00 --policy config --policy min:1 --out log-out

policies: config (serve_config.yaml as it is, edge.prewarm too when enabled), zero:SECONDS
(downscale_to_zero_delay_s), min:N (min_replicas), keep-warm:START-END (local hours per
region), schedule (the config's own KeepWarm windows), predictive[:MIN_EXPECTED:LOOKAHEAD_S]
(edge_sim/prewarm.py, the config's edge.prewarm settings unless given).
"""


def build_parser(prog: str = "edge plan") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Capacity planner: a trace through the router's own routing code and a "
        "model of Serve's autoscaler, on a virtual clock (no Ray, no cluster).",
        epilog=EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", default="serve_config.yaml", help="%(default)s")
    world = parser.add_argument_group("world (default: the config's colos and regions)")
    world.add_argument("--colos", type=int, help="a synthetic world of this many colos")
    world.add_argument("--regions", type=int, default=20, help="with --colos (%(default)s)")
    trace = parser.add_argument_group("trace")
    trace.add_argument(
        "--trace",
        default="diurnal",
        help=f"diurnal | follow-the-sun | flat | {source_names(' | ')} (records: a load test's "
        "requests.csv; request-log: the gateway's, docs/plan.md)",
    )
    trace.add_argument(
        "--since",
        type=parse_when,
        metavar="WHEN",
        help="request-log: rows that ended at or after (ISO 8601, UTC unless it says; or unix s)",
    )
    trace.add_argument("--until", type=parse_when, metavar="WHEN", help="request-log: before")
    trace.add_argument("--requests", type=float, default=100_000, help="expected requests")
    trace.add_argument("--hours", type=float, default=24.0, help="trace length")
    trace.add_argument("--trough", type=float, default=0.05, help="night rate / peak rate")
    trace.add_argument("--start-utc-hour", type=float, default=0.0, help="UTC hour at t=0")
    trace.add_argument("--burst", action="append", default=[], metavar="START_S:DURATION_S:FACTOR")
    trace.add_argument("--seed", type=int, default=0)
    run = parser.add_argument_group("simulation")
    run.add_argument("--outage", action="append", default=[], metavar="REGION:START_S:DURATION_S")
    run.add_argument(
        "--colo-fault",
        action="append",
        default=[],
        metavar="COLO:FAULT_JSON",
        help="a colo drill, the admin API's and the load tester's fault JSON, e.g. "
        '\'FRA:{"down": true, "start_after_s": 43200, "duration_s": 3600}\' (repeatable)',
    )
    run.add_argument("--policy", action="append", default=[], help="repeatable; see below")
    run.add_argument(
        "--no-warm-pool", action="store_true", help="cold starts without the warm worker pool"
    )
    run.add_argument("--cold-start", action="append", default=[], metavar="MODEL=SECONDS")
    run.add_argument("--service-ms", action="append", default=[], metavar="MODEL=MS")
    run.add_argument("--measure-from-h", type=float, default=0.0, help="figures from this hour")
    parser.add_argument("--out", type=Path, default=Path("plan-out"), help="%(default)s")
    return parser


def parse_when(text: str) -> float:
    """`--since`/`--until`: unix seconds, or an ISO 8601 time (UTC unless it names a zone)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time: {text!r} (ISO 8601 or unix seconds)"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _pairs(values: Sequence[str], what: str) -> dict[str, float]:
    out = {}
    for value in values:
        name, _, number = value.partition("=")
        try:
            out[name] = float(number)
        except ValueError:
            raise ValueError(f"{what}: expected MODEL=NUMBER, got {value!r}") from None
    return out


def _fields(value: str, what: str, n: int) -> list[str]:
    parts = value.split(":")
    if len(parts) != n:
        raise ValueError(f"{what}: expected {n} ':'-separated fields, got {value!r}")
    return parts


def parse_colo_faults(values: Sequence[str]) -> dict[str, list[ColoFault]]:
    """`--colo-fault COLO:JSON`s, a colo's faults in the order given (faults at a colo combine)."""
    faults: dict[str, list[ColoFault]] = {}
    for value in values:
        colo, colon, body = value.partition(":")
        if not colon or not colo:
            raise ValueError(f"--colo-fault: expected COLO:FAULT_JSON, got {value!r}")
        try:
            fault = ColoFault.model_validate_json(body)
        except ValueError as error:
            raise ValueError(f"--colo-fault {value!r}: {_short(error)}") from None
        faults.setdefault(colo, []).append(fault)
    return faults


def _short(error: ValueError) -> str:
    errors = getattr(error, "errors", None)
    if errors is None:
        return str(error)
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'fault'}: {e['msg']}"
        for e in errors(include_url=False)
    )


def parse_policy(text: str, config: ServePlanConfig) -> Policy:
    name, _, rest = text.partition(":")
    try:
        prewarm = config.edge.prewarm  # the config's forecaster settings, on or off
        if name == "config":
            if prewarm.enabled:  # as deployed: edge-control pre-warms
                return predictive(prewarm, name="config (pre-warming)")
            return scale_to_zero()
        if name == "zero":
            return scale_to_zero(float(rest))
        if name == "min":
            return always_warm(int(rest or 1))
        if name == "keep-warm":
            start, _, end = rest.partition("-")
            return keep_warm_hours(float(start), float(end))
        if name == "predictive":
            if not rest:
                return predictive(prewarm)
            expected, lookahead = rest.split(":")
            return predictive(
                prewarm.model_copy(
                    update={"min_expected": float(expected), "lookahead_s": float(lookahead)}
                )
            )
        if name == "schedule":
            if not config.keep_warm:
                raise ValueError("the config has no KeepWarm schedule")
            schedules = config.keep_warm
            monday = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday
            return Policy(
                "schedule",
                floor=lambda world, trace: KeepWarmFloor(schedules, monday),
                description="the config's KeepWarm windows (t=0: a Monday 00:00 UTC)",
            )
    except ValueError as error:
        raise ValueError(f"--policy {text!r}: {error}") from None
    raise ValueError(f"--policy {text!r}: unknown (config, zero:S, min:N, keep-warm:A-B, ...)")


def main(argv: Sequence[str] | None = None, prog: str = "edge plan") -> int:
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        config = load_serve_config(args.config)
        if args.colos:
            world = synthetic_world(args.colos, args.regions, seed=args.seed, base=config.edge)
            specs = {
                model: config.specs[next(k for k in config.specs if k[0] == model)]
                for model in config.models
            }
        else:
            world = World.with_colo_origins(config.edge, args.seed)
            specs = dict(config.specs)  # type: ignore[arg-type]
        cold = dict(COLD_START_NO_WARM_POOL_S if args.no_warm_pool else COLD_START_S)
        cold.update(_pairs(args.cold_start, "--cold-start"))
        service = {**SERVICE_MS, **_pairs(args.service_ms, "--service-ms")}
        settings = config.settings(
            cold_start_s=cold,
            service_ms=service,
            measure_from_s=args.measure_from_h * 3600,
            seed=args.seed,
        )
        outages = [
            RegionOutage(region=r, start_s=float(s), duration_s=float(d))
            for r, s, d in (_fields(o, "--outage", 3) for o in args.outage)
        ]
        unknown = sorted({o.region for o in outages} - set(world.region_names))
        if unknown:
            raise ValueError(
                f"--outage: unknown regions {unknown}; known: {', '.join(world.region_names)}"
            )
        colo_faults = parse_colo_faults(args.colo_fault)
        unknown = sorted(set(colo_faults) - set(world.ranker.colo_ids))
        if unknown:
            raise ValueError(f"--colo-fault: unknown colos {unknown}")
        bursts = [
            Burst(start_s=float(s), duration_s=float(d), factor=float(f))
            for s, d, f in (_fields(b, "--burst", 3) for b in args.burst)
        ]
        policies = [parse_policy(p, config) for p in (args.policy or ["config"])]
        replay = replay_source(
            args.trace, SourceScope(world.edge, config.models, args.since, args.until)
        )
        trace_factory = _trace_factory(args, world, config, bursts, replay)
        trace_factory()  # a bad trace fails here, before any run
    except (ConfigError, EdgeConfigError, ValueError, OSError) as error:
        print(f"{prog}: {error}", file=sys.stderr)
        return 2
    if replay is not None:
        print(replay_line(_replay_params(replay)))
    started = time.perf_counter()
    runs = compare(world, trace_factory, specs, policies, settings, outages, colo_faults)
    first = runs[0][1]
    params = {
        "config": args.config,
        "trace": shown(args.trace),
        "duration_s": first.duration_s,
        "measure_from_s": first.measured_from_s,
        "colos": len(world.topology.colos),
        "regions": list(world.region_names),
        "outages": [o.model_dump() for o in outages],
        "colo_faults": {c: [f.model_dump() for f in fs] for c, fs in colo_faults.items()},
        "seed": args.seed,
        "simulated_in_s": round(time.perf_counter() - started, 2),
    }
    if replay is not None:
        params["replay"] = _replay_params(replay)
    summary = write_plan_report(runs, args.out, params)
    t = summary["totals"]
    print(
        f"{t['arrivals']:,} requests: p50 {t['p50_ms']} ms, p99 {t['p99_ms']} ms, "
        f"{t['cold_starts']:,} cold, {t['sheds']:,} shed, {t['replica_s'] / 3600:,.1f} "
        f"replica-hours; report: {args.out / REPORT_MD}"
    )
    return 0


def _replay_params(replay: Replay) -> dict[str, object]:
    started = replay.started_at_s
    return {
        "requests": replay.requests,
        "started_at_utc": None
        if started is None
        else datetime.fromtimestamp(started, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "skipped": replay.skipped,
    }


def _trace_factory(
    args: argparse.Namespace,
    world: World,
    config: ServePlanConfig,
    bursts: list[Burst],
    replay: Replay | None,
):
    if replay is not None:
        return lambda: replay.trace  # read once: every run reads its chunks from memory
    if args.trace not in ("diurnal", "follow-the-sun", "flat"):
        raise ValueError(
            f"--trace {shown(args.trace)!r}: diurnal, follow-the-sun, flat or {source_names()}"
        )
    if args.since is not None or args.until is not None:
        raise ValueError("--since/--until: only with a replayed trace that has wall-clock times")
    spec = TraceSpec(
        requests=args.requests,
        duration_s=args.hours * 3600,
        shape=args.trace,
        trough_ratio=args.trough,
        start_utc_hour=args.start_utc_hour,
        model_shares={m: 1.0 for m in config.models},
        bursts=bursts,
        seed=args.seed,
    )
    return lambda: generate(spec, world.origins)


if __name__ == "__main__":
    sys.exit(main())
