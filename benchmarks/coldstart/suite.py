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
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import yaml
from ray import serve

from benchmarks.coldstart.cluster import (
    EDGE_APP,
    edge_application,
    empty_application,
)
from benchmarks.coldstart.config import ColdStartBenchConfig
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
from benchmarks.coldstart.summary import (
    EMPTY,
    NO_POOL,
    goals,
    overhead_ratios,
    summarize_cycles,
    summarize_keep_warm,
    summarize_upscale,
    warm_pool_ratios,
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
from benchmarks.lib.goals import ratio
from benchmarks.lib.processes import cpu_share_at_rest
from deployments.config import ModelConfig, parse_app_config
from deployments.serve_file import without_regions
from edgectl.local_cluster import LocalCluster, wait_until

log = logging.getLogger(__name__)

NEEDS_RAY = True


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

    return cpu_share_at_rest(
        lambda: [pid for node in cluster.nodes for pid in node.pids("")],
        config.platform_idle_cpu_s,
    )


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
