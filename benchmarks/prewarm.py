"""Predictive pre-warming, live (suite `prewarm`): the load tester's diurnal scenario, two days
compressed to `day_s` each, on a private cluster with the shipped three regions (one model,
moderation, every pool at zero, scale-to-zero delays compressed with the day), run twice on the
same seeded schedule: scale-to-zero as configured, then with `edge.prewarm` on (edge-control
holds the pools its forecast expects busy; deployments/control/prewarm.py). Figures from the second
day (the forecaster's same-time-yesterday needs one): requests that met a cold start, and replica-
seconds (Serve's replicas running or starting, as the planner counts them, sampled every 0.5 s;
running alone beside). Goal: at least 80% of scale-to-zero's cold starts hidden for at most 25%
more replica-seconds. The arms run one after the other, not interleaved: the machine's load
between them is part of the figure. Always-warm's cost is the day's length times the
pools; the planner's prediction for both arms, on the first arm's own records, stands beside.
A compressed day is not a day: the cold start (about a second) does not shrink with it, so the
forecast's lookahead and Serve's delays are set for this clock, not the shipped one's."""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from benchmarks.lib.config import BenchConfig
from benchmarks.lib.goals import GoalRecord, goal, ratio
from deployments.serve_file import serve_only, set_router_listener
from edge_sim.plan.policies import compare, predictive, scale_to_zero
from edge_sim.plan.summary import totals
from edge_sim.plan.world import World
from edge_sim.prewarm import PrewarmConfig
from edgectl.plan.config import load_serve_config
from edgectl.plan.sources.loadtest import read_loadtest_records

NEEDS_RAY = True
REPO = Path(__file__).resolve().parent.parent
MODEL = "moderation"  # the cheapest model: the figure is about replicas, not the model's work
LOAD_KEY = "sk-bench-load-0000"
HIDDEN_GOAL, EXTRA_COST_GOAL = 0.80, 0.25
MEASURED_DAY = "day 2"
MAX_ERROR_SHARE = 0.01  # more failed requests than this in an arm: its figures are not a result
log = logging.getLogger(__name__)


class PrewarmBenchConfig(BenchConfig):
    QUICK = {"day_s": 60.0, "rate_rps": 4.0, "to_zero_s": 3.0, "bucket_s": 2.0, "lookahead_s": 8.0}

    day_s: float = Field(default=240.0, gt=0, description="one compressed day")
    rate_rps: float = Field(default=10.0, gt=0, description="requests/s at every region's peak")
    trough_ratio: float = Field(default=0.0, ge=0, le=1, description="night rate / peak rate")
    to_zero_s: float = Field(
        default=6.0, gt=0, description="downscale_to_zero_delay_s (and downscale_delay_s)"
    )
    bucket_s: float = Field(default=4.0, gt=0, description="edge.prewarm.bucket_s")
    lookahead_s: float = Field(default=16.0, gt=0, description="edge.prewarm.lookahead_s")
    min_expected: float = Field(default=3.0, gt=0, description="edge.prewarm.min_expected")
    seed: int = 0
    ray_num_cpus: int = Field(default=4, ge=1)
    deploy_timeout_s: float = Field(default=600, gt=0)

    def prewarm(self, enabled: bool) -> PrewarmConfig:
        return PrewarmConfig(
            enabled=enabled,
            bucket_s=self.bucket_s,
            lookahead_s=self.lookahead_s,
            min_expected=self.min_expected,
            period_s=self.day_s,
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("prewarm suite")
    group.add_argument("--prewarm-day-s", type=float, help="one compressed day (default 240)")
    group.add_argument("--prewarm-rate", type=float, help="requests/s at the peaks (default 10)")


def prewarm_serve_config(
    models_dir: Path, http_port: int, bench: PrewarmBenchConfig, prewarm: PrewarmConfig
) -> dict[str, Any]:
    """The shipped config narrowed to MODEL, every region's pool at zero, at most one replica,
    scale-to-zero after `to_zero_s`, the simulated RTT reported but not slept."""
    config = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    config["http_options"] = {"host": "127.0.0.1", "port": http_port}
    app = config["applications"][0]
    args = app["args"]
    args["models_dir"] = str(models_dir)
    serve_only(args, [MODEL])
    set_router_listener(args, None)
    args["edge"]["latency"]["real_delay_scale"] = 0
    args["edge"]["prewarm"] = prewarm.model_dump(mode="json")
    args["security"]["per_key"] = {"load": {"requests_per_minute": None}}
    deployments = []
    for deployment in app["deployments"]:
        model, _, _ = deployment["name"].rpartition("-")
        if deployment["name"] == "router":
            deployments.append(deployment)
        elif model == MODEL:
            deployment["autoscaling_config"].update(
                initial_replicas=0,
                max_replicas=1,
                downscale_delay_s=bench.to_zero_s,
                downscale_to_zero_delay_s=bench.to_zero_s,
            )
            deployments.append(deployment)
    app["deployments"] = deployments
    return config


def run_arm(cluster: Any, base_url: str, out: Path, bench: PrewarmBenchConfig) -> dict[str, Any]:
    """Two compressed days of the diurnal scenario through the load tester; its summary.json."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgectl.loadtest",
            "--scenario=diurnal",
            f"--url={base_url}",
            f"--out={out}",
            f"--models={MODEL}",
            f"--api-key={LOAD_KEY}",
            f"--rate={bench.rate_rps}",
            f"--duration-s={2 * bench.day_s}",
            f"--day-s={bench.day_s}",
            f"--trough={bench.trough_ratio}",
            f"--seed={bench.seed}",
            "--replicas-every-s=0.5",
            "--no-progress",
        ],  # fmt: skip
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=2 * bench.day_s + 600,
    )
    if run.returncode != 0:
        raise RuntimeError(f"the load tester failed: {run.stderr[-2000:]}")
    return dict(json.loads((out / "summary.json").read_text()))


def measured_day(summary: dict[str, Any]) -> dict[str, Any]:
    """The second day's figures from a load-tester summary."""
    day = summary["by_phase"].get(MEASURED_DAY, {})

    def total(figure: str) -> float:
        pools = summary["replicas"].values()
        return round(sum(pool[figure].get(MEASURED_DAY, 0.0) for pool in pools), 1)

    return {
        "requests": day.get("requests", 0),
        "errors": sum(day.get("errors", {}).values()),
        "cold_starts": day.get("cold_starts", 0),
        "cold_start_ms_p50": (day.get("cold_start_ms") or {}).get("p50"),
        "route_reasons": summary["route_reasons"],  # the whole run's
        "replica_s": total("replica_s_by_phase"),  # running or starting, as the planner counts
        "running_replica_s": total("running_replica_s_by_phase"),
        "replica_samples": summary["replica_sampling"]["samples"],
    }


def planned(records: Path, serve_config: Path, bench: PrewarmBenchConfig) -> dict[str, Any]:
    """The planner on the live run's own records: both arms, second day, with the cold start
    measured in that run (as `edge plan --cold-start` takes it)."""
    config = load_serve_config(serve_config)
    trace, live = read_loadtest_records(records)
    waits = [r.cold_start_ms for r in live if r.cold_start and r.cold_start_ms]
    cold_s = statistics.median(waits) / 1000 if waits else None
    settings = config.settings(
        measure_from_s=bench.day_s, **({"cold_start_s": {MODEL: cold_s}} if cold_s else {})
    )
    runs = compare(
        World(config.edge, trace.origins),
        lambda: read_loadtest_records(records)[0],
        config.specs,
        [scale_to_zero(), predictive(bench.prewarm(True))],
        settings,
    )
    zero, ahead = (totals(result) for _, result in runs)
    return {
        "cold_start_s": cold_s,
        **{
            name: {"cold_starts": f["cold_starts"], "replica_s": round(f["replica_s"], 1)}
            for name, f in (("scale_to_zero", zero), ("predictive", ahead))
        },
    }


def compare_arms(zero: dict[str, Any], ahead: dict[str, Any], warm_s: float) -> dict[str, Any]:
    hidden = 1 - ahead["cold_starts"] / zero["cold_starts"] if zero["cold_starts"] else None
    compared = {
        "hidden_vs_scale_to_zero": None if hidden is None else round(hidden, 3),
        "extra_replica_s_vs_scale_to_zero": ratio(
            ahead["replica_s"] - zero["replica_s"], zero["replica_s"]
        ),
        "replica_s_vs_always_warm": ratio(ahead["replica_s"], warm_s),
        "scale_to_zero_vs_always_warm": ratio(zero["replica_s"], warm_s),
    }
    if "running_replica_s" in zero:  # live: the same without the replicas' start-up
        compared["extra_running_replica_s_vs_scale_to_zero"] = ratio(
            ahead["running_replica_s"] - zero["running_replica_s"], zero["running_replica_s"]
        )
    return compared


def prewarm_goals(compared: dict[str, Any], missing: str) -> dict[str, GoalRecord]:
    return {
        "prewarm_live_hidden_share": goal(
            compared.get("hidden_vs_scale_to_zero"),
            HIDDEN_GOAL,
            "share of scale-to-zero's cold starts hidden",
            missing=missing,
        ),
        "prewarm_live_extra_replica_s": goal(
            compared.get("extra_replica_s_vs_scale_to_zero"),
            EXTRA_COST_GOAL,
            "share of scale-to-zero's replica-seconds",
            at_most=True,
            missing=missing,
        ),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    given = {"day_s": args.prewarm_day_s, "rate_rps": args.prewarm_rate}
    bench = PrewarmBenchConfig.from_args(args, **{k: v for k, v in given.items() if v is not None})
    return run_prewarm_suite(bench)


def run_prewarm_suite(bench: PrewarmBenchConfig) -> dict[str, Any]:
    from edgectl.local_cluster import free_port, running, wait_until

    result: dict[str, Any] = {"config": bench.model_dump(mode="json")}
    root = Path(tempfile.mkdtemp(prefix="bench-prewarm-"))
    env = {"EDGE_API_KEYS": f"load:{LOAD_KEY}"}
    phase = "cluster"
    try:
        with running(num_cpus=bench.ray_num_cpus, env=env) as cluster:
            port = free_port()
            base_url = f"http://127.0.0.1:{port}"

            def deploy(prewarm: PrewarmConfig) -> Path:
                path = root / f"serve-{'prewarm' if prewarm.enabled else 'zero'}.yaml"
                config = prewarm_serve_config(bench.models_dir, port, bench, prewarm)
                path.write_text(yaml.safe_dump(config, sort_keys=False))
                cluster.serve_deploy(path, attempts=3)
                return path

            def all_at_zero() -> bool:
                status = yaml.safe_load(cluster.cli("serve", "status"))["applications"]["edge"]
                return status["status"] == "RUNNING" and not any(
                    d["replica_states"].get(state)
                    for name, d in status["deployments"].items()
                    if name.startswith(f"{MODEL}-")
                    for state in ("RUNNING", "STARTING")
                )

            arms: dict[str, dict[str, Any]] = {}
            paths: dict[str, Path] = {}
            for arm, enabled in (("scale_to_zero", False), ("predictive", True)):
                phase = f"{arm}: deploy"
                paths[arm] = deploy(bench.prewarm(enabled))
                wait_until(all_at_zero, bench.deploy_timeout_s, "every pool at zero", every_s=2)
                phase = f"{arm}: load"
                log.info("prewarm: %s, two days of %g s", arm, bench.day_s)
                summary = run_arm(cluster, base_url, root / arm, bench)
                arms[arm] = measured_day(summary)
            result.update(arms)
            pools = 3  # the shipped regions, one pool of MODEL each
            warm_s = pools * bench.day_s
            result["always_warm"] = {"cold_starts": 0, "replica_s": warm_s}
            phase = "compare"
            failing = {
                arm: f"{day['errors']} of {day['requests']}"
                for arm, day in arms.items()
                if day["errors"] > MAX_ERROR_SHARE * max(1, day["requests"])
            }
            if failing:
                # Cold starts of requests that failed are not seen: no comparison to make.
                raise RuntimeError(f"requests failed on day two: {failing}")
            result["compared"] = compare_arms(arms["scale_to_zero"], arms["predictive"], warm_s)
            phase = "planner"
            result["planned"] = planned(
                root / "scale_to_zero" / "requests.csv", paths["predictive"], bench
            )
            result["planned"]["compared"] = compare_arms(
                result["planned"]["scale_to_zero"], result["planned"]["predictive"], warm_s
            )
    except Exception as exc:  # noqa: BLE001 - what was measured is kept, the failure named
        log.exception("prewarm: %s failed", phase)
        result["error"] = f"{phase}: {type(exc).__name__}: {exc}"
    result["out_dir"] = str(root)
    result["goals"] = prewarm_goals(result.get("compared", {}), result.get("error", "not run"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.prewarm", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models-dir", default="models")
    add_arguments(parser)
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)
    json.dump(run(parser.parse_args(argv)), sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
