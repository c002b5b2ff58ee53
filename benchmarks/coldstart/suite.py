"""The cold-start suite: each model from zero replicas to its first response (p50 over cycles, split
into phases), next to a model-less replica and the in-process load + warm-up measured in the same
run; then the reaction to a load step (1 -> 2 replicas), and a keep-warm window waking a model
ahead of its first request. Each model is cycled with the warm pool (deployments.control.warm_pool,
as shipped) and, alternating with it, in a copy of the application without one, so the pool's gain
is a ratio measured under the same load; after each cold start with the pool, the time until the
pool has replaced the worker it took. With every model at zero, the controller's CPU (the cost of
serve_config.yaml's shorter control loop). The --coldstart-* variants compare other settings."""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import httpx
import yaml
from pydantic import Field
from ray import serve

from benchmarks.coldstart.cluster import (
    EDGE_APP,
    BenchScaling,
    ServeVariant,
    edge_application,
    empty_application,
)
from benchmarks.coldstart.controller_cpu import idle_cpu_share
from benchmarks.coldstart.controller_log import ControllerLog
from benchmarks.coldstart.imports import replica_import_costs
from benchmarks.coldstart.keep_warm import run_keep_warm
from benchmarks.coldstart.load import load_times
from benchmarks.coldstart.probe import (
    EMPTY_TARGET,
    ColdTarget,
    NotAColdStartError,
    cold_start_cycle,
    model_target,
    steady_warm_latency,
    timed_request,
    wait_for_zero,
)
from benchmarks.coldstart.upscale import run_upscale
from benchmarks.coldstart.warm_pool import (
    NO_POOL_APP,
    NO_POOL_ROUTE,
    idle_warm_workers,
    no_warm_pool_application,
    pool_target,
)
from benchmarks.lib.cluster import apply_applications, serve_cluster
from benchmarks.lib.config import BenchConfig
from benchmarks.lib.goals import GoalRecord, goal, ratio
from benchmarks.lib.processes import (
    cpu_seconds_by_pid,
    cpu_used_between,
    cpu_used_by_title,
    process_title,
)
from deployments.config import PROJECT_ROOT, ModelConfig, parse_app_config
from deployments.serve_file import without_regions
from edgectl.local_cluster import LocalCluster, wait_until

log = logging.getLogger(__name__)

NEEDS_RAY = True

MODELS = ("glm", "kimi", "embedding", "moderation")
COLD_START_TARGET_S = 0.75  # p50 zero -> first response, per default model
AFTER_COLD_TARGET = 1.5  # the request after a cold start / a warm one, at most
IDLE_PLATFORM_TARGET = 0.10  # the whole cluster at zero traffic, share of one core, at most
OVERHEAD_RATIO_TARGET = 1.2  # cold start / (empty replica start + in-process load), at most
EMPTY = "empty_replica"
# A cold start from request to response, in order (probe.split_phases says what each covers).
GOAL_PHASES = (
    "controller_decision_s",
    "replica_requested_s",
    "worker_scheduling_s",
    "process_start_s",
    "model_load_s",
    "warmup_s",
    "init_other_s",
    "ready_to_running_s",
    "running_to_response_s",
)
NO_POOL = "/no_warm_pool"  # suffix of a model's name for its cycles without the pool


class ColdStartBenchConfig(BenchConfig):
    QUICK = {
        "cycles": 2,
        "models": ("glm", "moderation"),
        "in_process_repetitions": 1,
        "import_repetitions": 0,  # the fresh-interpreter import timing alone takes ~10 s
        "upscale_repetitions": 1,
    }

    serve_config: Path = PROJECT_ROOT / "serve_config.yaml"
    models: tuple[str, ...] = MODELS
    cycles: int = Field(default=5, ge=1, description="cold starts per model (and empty replica)")
    http_port: int = Field(default=8124, ge=1024, le=65535)
    ray_num_cpus: int = Field(default=4, ge=1)
    deploy_timeout_s: float = Field(default=240, gt=0)
    cycle_timeout_s: float = Field(default=120, gt=0)
    in_process_repetitions: int = Field(default=3, ge=1)
    import_repetitions: int = Field(default=3, ge=0, description="0 skips the import timing")
    variant: ServeVariant = ServeVariant()
    scaling: BenchScaling = BenchScaling()
    upscale_model: str | None = Field(default="glm", description="a chat model; None skips it")
    upscale_streams: int = Field(default=16, ge=1, description="the load step, in streams")
    upscale_repetitions: int = Field(default=2, ge=0)
    upscale_max_tokens: int = Field(default=32, ge=1)
    compare_without_warm_pool: bool = Field(
        default=True, description="also cycle each model in a copy of the app without the pool"
    )
    settle_at_zero_s: float = Field(
        default=2.0,
        ge=0,
        description="wait after reaching zero: a model idle for minutes has handles that know it "
        "has no replica, so the request's handle reports it to the controller at once",
    )
    warm_pool_fill_timeout_s: float = Field(
        default=60, gt=0, description="a cycle with the pool waits this long for a full pool"
    )
    controller_idle_cpu_s: float = Field(
        default=10.0, ge=0, description="time the controller's CPU at zero this long; 0 skips"
    )
    platform_idle_cpu_s: float = Field(
        default=20.0,
        ge=0,
        description="time every process of the cluster at zero traffic this long, the shipped "
        "application alone deployed; 0 skips",
    )
    platform_idle_settle_s: float = Field(
        default=10.0, ge=0, description="wait this long at zero before timing the idle cluster"
    )
    keep_warm: bool = Field(default=True, description="time a keep-warm window's wake-up")
    keep_warm_lead_s: float = Field(
        default=45, gt=0, description="the window opens this long after its deploy is sent"
    )

    @classmethod
    def from_args(cls, args: argparse.Namespace, **fields: Any) -> Self:
        variant = ServeVariant(
            metrics_interval=args.coldstart_metrics_interval,
            runtime_env=args.coldstart_runtime_env,
            ray_env=dict(item.split("=", 1) for item in args.coldstart_ray_env or ()),
            control_loop_s=args.coldstart_control_loop_s,
        )
        fields |= {"http_port": args.coldstart_http_port, "variant": variant}
        if args.coldstart_cycles is not None:
            fields["cycles"] = args.coldstart_cycles
        if args.coldstart_models:
            fields["models"] = tuple(args.coldstart_models.split(","))
        if args.coldstart_without_pool_comparison:
            fields["compare_without_warm_pool"] = False
        if args.coldstart_import_repetitions is not None:
            fields["import_repetitions"] = args.coldstart_import_repetitions
        if args.coldstart_without_keep_warm:
            fields["keep_warm"] = False
        if args.coldstart_upscale_repetitions is not None:
            fields["upscale_repetitions"] = args.coldstart_upscale_repetitions
        return super().from_args(args, **fields)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("coldstart suite")
    group.add_argument("--coldstart-http-port", type=int, default=8124)
    group.add_argument("--coldstart-cycles", type=int, help="cold starts per model")
    group.add_argument("--coldstart-models", help="comma-separated, default: all four")
    group.add_argument(
        "--coldstart-metrics-interval",
        choices=("shipped", "default"),
        default="shipped",
        help="autoscaling metrics push interval: serve_config.yaml's metrics_interval_s "
        "(shipped) or Ray Serve's default of 10 s (default)",
    )
    group.add_argument(
        "--coldstart-runtime-env",
        choices=("app", "none"),
        default="app",
        help="keep serve_config.yaml's app runtime_env, with its RAY_SERVE_*_PUSH_INTERVAL_S "
        "variables (app), or deploy without one (none)",
    )
    group.add_argument(
        "--coldstart-control-loop-s",
        type=float,
        help="Serve's control loop interval for this run instead of serve_config.yaml's "
        "controller_options (Ray Serve's default: 0.1)",
    )
    group.add_argument(
        "--coldstart-ray-env",
        action="append",
        metavar="RAY_X=VALUE",
        help="raylet setting for this run, e.g. RAY_num_workers_soft_limit=16 (repeatable)",
    )
    group.add_argument("--coldstart-upscale-repetitions", type=int, help="0 skips it")
    group.add_argument("--coldstart-import-repetitions", type=int, help="0 skips it")
    group.add_argument(
        "--coldstart-without-keep-warm", action="store_true", help="skip the keep-warm window"
    )
    group.add_argument(
        "--coldstart-without-pool-comparison",
        action="store_true",
        help="skip the cycles in a copy of the application without the warm pool",
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)
    return run_coldstart_suite(ColdStartBenchConfig.from_args(args))


def run_coldstart_suite(config: ColdStartBenchConfig) -> dict[str, Any]:
    # One pool per model: the cold start of a model, not the regions' detours around it.
    shipped = without_regions(yaml.safe_load(config.serve_config.read_text()), home="eu")
    edge = edge_application(
        shipped, str(config.models_dir), config.models, config.scaling, config.variant
    )
    app_config = parse_app_config(edge["args"])
    tasks = {name: app_config.models[name].task for name in config.models}
    # Before Ray starts, so that neither waits on the other's CPU.
    in_process = in_process_load(config, {n: app_config.models[n] for n in tasks})
    imports = replica_import_costs(config.import_repetitions) if config.import_repetitions else None
    empty = empty_application(edge, like=config.models[0], variant=config.variant)
    targets = {EMPTY: EMPTY_TARGET, **{n: model_target(n, task) for n, task in tasks.items()}}
    applications = [edge, empty]
    if config.compare_without_warm_pool:
        applications.append(no_warm_pool_application(edge))
        for name, task in tasks.items():
            targets[name + NO_POOL] = model_target(name, task, NO_POOL_APP, NO_POOL_ROUTE)
    started = time.monotonic()
    with serve_cluster(
        config.ray_num_cpus,
        config.http_port,
        config.variant.ray_env,
        config.variant.controller_options(shipped),
    ) as cluster:
        ray_up_s = time.monotonic() - started
        controller = ControllerLog(cluster.session_dir)
        apply_applications(applications, config.http_port, config.deploy_timeout_s)
        cycles = run_cycles(config, targets, controller)
        controller_cpu = controller_idle_cpu(config, list(targets.values()), controller)
        warm = warm_latencies(config, targets)
        upscale = None
        upscale_model = config.upscale_model or ""
        if tasks.get(upscale_model) == "chat" and config.upscale_repetitions:
            upscale = run_upscale(
                targets[upscale_model],
                controller,
                config.upscale_streams,
                config.upscale_repetitions,
                config.upscale_max_tokens,
                config.cycle_timeout_s,
            )
        keep_warm = None
        if config.keep_warm:
            with httpx.Client(
                base_url=f"http://127.0.0.1:{config.http_port}", timeout=config.cycle_timeout_s
            ) as client:
                keep_warm = run_keep_warm(
                    client,
                    targets[config.models[0]],
                    applications,
                    config.http_port,
                    config.deploy_timeout_s,
                    config.keep_warm_lead_s,
                )
        idle_platform = platform_idle_cpu(config, cluster, edge, targets)
    cold_starts = {name: summarize_cycles(runs) for name, runs in cycles.items()}
    ratios = overhead_ratios(cold_starts, in_process)
    after_cold = after_cold_ratios(cold_starts, warm)
    return {
        "config": config.model_dump(mode="json"),
        "ray_and_serve_start_s": round(ray_up_s, 2),
        "cold_start": cold_starts,
        "in_process_load": in_process,
        "vs_empty_plus_load": ratios,
        "warm_pool_vs_none": warm_pool_ratios(cold_starts),
        "controller_at_zero": controller_cpu,
        "platform_at_zero": idle_platform,
        "after_cold_vs_warm": after_cold,
        "upscale": summarize_upscale(upscale),
        "keep_warm": summarize_keep_warm(keep_warm, cold_starts),
        "replica_imports": imports,
        "goals": goals(cold_starts, ratios, after_cold, idle_platform),
    }


def in_process_load(
    config: ColdStartBenchConfig, models: Mapping[str, ModelConfig]
) -> dict[str, Any]:
    """Each model's runtime constructed here, with the threads its replica gets: the load +
    warm-up a replica cannot avoid. Models sharing a thread count are measured together."""
    results: dict[str, Any] = {}
    for threads in sorted({model.intra_op_threads for model in models.values()}):
        tasks = {n: m.task for n, m in models.items() if m.intra_op_threads == threads}
        results |= load_times(config.models_dir, tasks, threads, config.in_process_repetitions)
    return results


def run_cycles(
    config: ColdStartBenchConfig, targets: Mapping[str, ColdTarget], controller: ControllerLog
) -> dict[str, list[dict[str, Any]]]:
    """Round-robin over the targets, each time from a cluster with no replica but the ingresses:
    a cold start never shares the CPU with another replica starting or stopping. A model of the
    shipped application starts with the warm pool full (idle workers are noted per cycle)."""
    cycles: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    everything = list(targets.values())
    with httpx.Client(
        base_url=f"http://127.0.0.1:{config.http_port}", timeout=config.cycle_timeout_s
    ) as client:
        for cycle in range(config.cycles):
            for name, target in targets.items():
                wait_for_zero(everything, config.cycle_timeout_s)
                time.sleep(config.settle_at_zero_s)
                idle = _wait_for_full_pool(client, config) if target.app == EDGE_APP else None
                try:
                    phases = cold_start_cycle(client, target, controller)
                except NotAColdStartError as error:
                    log.warning("cycle %d %s skipped: %s", cycle, name, error)
                    continue
                answered = time.monotonic()
                if target.is_model:
                    # At once: the first warm request, while the pool replaces its worker.
                    phases["after_cold_s"] = round(timed_request(client, target), 4)
                phases["pool_refilled_s"] = (
                    _pool_refill_s(client, config, answered) if idle is not None else None
                )
                wait_for_zero([target], config.cycle_timeout_s, every_s=0.1)
                phases["back_to_zero_s"] = round(time.monotonic() - answered, 2)
                phases["idle_warm_workers"] = idle
                log.info("cold start %s #%d: %s", name, cycle, phases)
                cycles[name].append(phases)
    return cycles


def controller_idle_cpu(
    config: ColdStartBenchConfig, targets: Sequence[ColdTarget], controller: ControllerLog
) -> dict[str, Any] | None:
    """The controller's CPU while every target is at zero, with the loop interval it ran."""
    pid = controller.controller_pid()
    if not config.controller_idle_cpu_s or pid is None:
        return None
    wait_for_zero(list(targets), config.cycle_timeout_s)
    shipped = yaml.safe_load(config.serve_config.read_text())
    return {
        "control_loop_interval_s": config.variant.control_loop_interval_s(shipped),
        "cpu_share_of_one_core": round(idle_cpu_share(pid, config.controller_idle_cpu_s), 3),
    }


def warm_latencies(
    config: ColdStartBenchConfig, targets: Mapping[str, ColdTarget]
) -> dict[str, float]:
    """Each model of the shipped application woken and kept busy until its warm pool is full
    again, then a warm request's seconds (the baseline of the request after a cold start)."""
    warm = {}
    with httpx.Client(
        base_url=f"http://127.0.0.1:{config.http_port}", timeout=config.cycle_timeout_s
    ) as client:
        full = pool_target(client)

        def pool_full() -> bool:
            idle = idle_warm_workers(client)
            return idle is None or idle >= full

        for name, target in targets.items():
            if target.app == EDGE_APP and target.is_model:
                warm[name] = round(
                    steady_warm_latency(client, target, pool_full, config.warm_pool_fill_timeout_s),
                    4,
                )
    return warm


def after_cold_ratios(
    cold_starts: Mapping[str, Mapping[str, Any]], warm: Mapping[str, float]
) -> dict[str, Any]:
    """Each model's request right after a cold start (p50 over cycles) over its warm request."""
    ratios = {}
    for name, warm_s in warm.items():
        after_s = cold_starts.get(name, {}).get("p50", {}).get("after_cold_s")
        ratios[name] = {
            "after_cold_p50_s": after_s,
            "warm_s": warm_s,
            "ratio": ratio(after_s, warm_s),
        }
    return ratios


def platform_idle_cpu(
    config: ColdStartBenchConfig,
    cluster: LocalCluster,
    edge: dict[str, Any],
    targets: Mapping[str, ColdTarget],
) -> dict[str, Any] | None:
    """Every process of the cluster (GCS, raylet, dashboard, Serve's controller and proxy, the
    routers, edge-control, the warm pool) with the shipped application alone deployed and every
    model at zero: the share of one core the platform costs doing nothing."""
    if not config.platform_idle_cpu_s:
        return None
    apply_applications([edge], config.http_port, config.deploy_timeout_s)
    wait_until(
        lambda: set(serve.status().applications) == {EDGE_APP},
        config.deploy_timeout_s,
        "the comparison applications deleted",
    )
    wait_for_zero([t for t in targets.values() if t.app == EDGE_APP], config.cycle_timeout_s)
    time.sleep(config.platform_idle_settle_s)

    def reading() -> dict[int, float]:
        return cpu_seconds_by_pid(pid for node in cluster.nodes for pid in node.pids(""))

    before, started = reading(), time.monotonic()
    time.sleep(config.platform_idle_cpu_s)
    after = reading()
    seconds = time.monotonic() - started
    titles = {pid: process_title(pid) for pid in after}
    return {
        "processes": len(after),
        "seconds": config.platform_idle_cpu_s,
        "cpu_share_of_one_core": round(cpu_used_between(before, after) / seconds, 3),
        "share_by_process": {
            title: round(used / seconds, 4)
            for title, used in cpu_used_by_title(before, after, titles).items()
        },
    }


def _wait_for_full_pool(client: httpx.Client, config: ColdStartBenchConfig) -> int | None:
    """The pool's idle workers once it is full (or at the timeout: a cycle still runs)."""
    full = pool_target(client)
    deadline = time.monotonic() + config.warm_pool_fill_timeout_s
    idle = idle_warm_workers(client)
    while idle is not None and idle < full and time.monotonic() < deadline:
        time.sleep(0.2)
        idle = idle_warm_workers(client)
    return idle


def _pool_refill_s(
    client: httpx.Client, config: ColdStartBenchConfig, answered: float
) -> float | None:
    """Seconds from a cold start's response until the pool is full again (the worker it took
    replaced: the router asks the pool to top up then); None if not within the fill timeout.
    The pool may not have noticed the taken worker yet: full counts only after a shortfall."""
    full = pool_target(client)
    short = False
    while time.monotonic() - answered < config.warm_pool_fill_timeout_s:
        idle = idle_warm_workers(client)
        if idle is not None and idle < full:
            short = True
        elif short:
            return round(time.monotonic() - answered, 2)
        time.sleep(0.25)
    return None


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 4) if present else None


def summarize_cycles(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """p50 of every phase over the cycles, and the cycles themselves."""
    if not runs:
        return {"cycles": 0}
    keys = [k for k, v in runs[0].items() if not isinstance(v, bool) and k != "idle_warm_workers"]
    return {
        "cycles": len(runs),
        "p50": {key: _median([run[key] for run in runs]) for key in keys},
        "max_total_s": round(max(run["total_s"] for run in runs), 4),
        "reused_workers": sum(bool(run["reused_worker"]) for run in runs),
        "runs": list(runs),
    }


def overhead_ratios(
    cold_starts: Mapping[str, Mapping[str, Any]], in_process: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """Each model's p50 cold start / (p50 empty replica cold start + in-process load+warm-up)."""
    empty_s = cold_starts[EMPTY].get("p50", {}).get("total_s")
    ratios = {}
    for name, load in in_process.items():
        cold_s = cold_starts.get(name, {}).get("p50", {}).get("total_s")
        if cold_s is None or empty_s is None:
            continue
        baseline_s = empty_s + load["total_wall_s"]
        ratios[name] = {
            "cold_start_p50_s": cold_s,
            "empty_replica_p50_s": empty_s,
            "in_process_load_warmup_s": load["total_wall_s"],
            "ratio": round(cold_s / baseline_s, 3),
        }
    return ratios


def warm_pool_ratios(cold_starts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Each model's p50 cold start with the pool / without it, cycles alternating in one run."""
    ratios = {}
    for name, summary in cold_starts.items():
        without = cold_starts.get(name + NO_POOL, {}).get("p50", {}).get("total_s")
        with_pool = summary.get("p50", {}).get("total_s")
        if name.endswith(NO_POOL) or without is None or with_pool is None:
            continue
        ratios[name] = {
            "with_pool_p50_s": with_pool,
            "without_pool_p50_s": without,
            "ratio": round(with_pool / without, 3),
            "reused_workers": f"{summary['reused_workers']}/{summary['cycles']}",
        }
    return ratios


def summarize_upscale(runs: Sequence[Mapping[str, Any]] | None) -> dict[str, Any] | None:
    if not runs:
        return None
    keys = [k for k in runs[0] if k.endswith("_s")]
    return {
        "repetitions": len(runs),
        "p50": {key: _median([run[key] for run in runs]) for key in keys},
        "runs": list(runs),
    }


def summarize_keep_warm(
    measured: Mapping[str, Any] | None, cold_starts: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The pre-warmed first request next to the same model's cold one (p50) from this run."""
    if not measured or "model" not in measured:
        return dict(measured) if measured else None
    cold_s = cold_starts.get(measured["model"], {}).get("p50", {}).get("total_s")
    return {
        **measured,
        "cold_first_response_p50_s": cold_s,
        "cold_over_prewarmed": round(cold_s / measured["first_response_s"], 1) if cold_s else None,
    }


def goals(
    cold_starts: Mapping[str, Mapping[str, Any]],
    ratios: Mapping[str, Mapping[str, Any]],
    after_cold: Mapping[str, Mapping[str, Any]] | None = None,
    idle_platform: Mapping[str, Any] | None = None,
) -> dict[str, GoalRecord]:
    result = {}
    for name, measured in (after_cold or {}).items():
        result[f"{name}_after_cold_vs_warm"] = goal(
            measured.get("ratio"),
            AFTER_COLD_TARGET,
            "x",
            at_most=True,
            missing="no cold start of it was measured",
            details=dict(measured),
            note="the request sent right after a cold start's response over a warm request "
            "once the warm pool is full again (p50 over cycles / median of 5)",
        )
    result["platform_idle_cpu_share"] = goal(
        idle_platform.get("cpu_share_of_one_core") if idle_platform else None,
        IDLE_PLATFORM_TARGET,
        "share of one core",
        at_most=True,
        missing="not measured (platform_idle_cpu_s is 0)",
        details=dict(idle_platform) if idle_platform else None,
        note="every process of the cluster (one node), the shipped application alone deployed, "
        "every model at zero, no traffic",
    )
    for name, summary in cold_starts.items():
        if name == EMPTY or name.endswith(NO_POOL):
            continue
        p50s = summary.get("p50", {})
        result[f"{name}_cold_start_p50"] = goal(
            p50s.get("total_s"),
            COLD_START_TARGET_S,
            "s",
            at_most=True,
            details={
                # Where the median went (each phase's own median: they need not add up to it).
                "phases_p50_s": {phase: p50s.get(phase) for phase in GOAL_PHASES},
                "cycles": summary.get("cycles", 0),
            },
        )
        result[f"{name}_cold_start_vs_empty_plus_load"] = goal(
            ratios.get(name, {}).get("ratio"), OVERHEAD_RATIO_TARGET, "x", at_most=True
        )
    return result
