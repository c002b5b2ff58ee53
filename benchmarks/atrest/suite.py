"""The at-rest suite: `serve run` of a temp copy of serve_config.yaml (our models/), left without
traffic until every model is at zero after its idle delay, then the CPU of every process of its
cluster (GCS, raylet, dashboard, Serve's controller and proxy, routers, edge-control, warm pool,
the `serve run` driver) over a window; then, the platform at zero, the embedding model's cold
starts cycle after cycle through the copy's HTTP port (cold_cycles.py). Ray Serve's hello world is
started and timed the same way first. Per-process CPU, not the machine's: the machine may be busy
with others' work."""

from __future__ import annotations

import argparse
import contextlib
import logging
import secrets
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.atrest import cold_cycles, serve_files
from benchmarks.atrest.config import AtRestBenchConfig, ColdCycleSettings
from benchmarks.atrest.serve_run import ServeRun, serve_run
from benchmarks.lib.goals import goal
from benchmarks.lib.processes import cpu_share_at_rest
from edgectl.local_cluster import free_port

log = logging.getLogger(__name__)

NEEDS_RAY = True
# Issue 43: at rest, the platform may cost Ray Serve's hello world + this share of one core.
OVER_HELLO_WORLD_TARGET_CORES = 0.05
# serve_config.yaml's router.request_timeout_s: a cold start slower than that is an error anyway.
REQUEST_TIMEOUT_S = 120.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the dashboard, polled each second
    return run_atrest_suite(AtRestBenchConfig.from_args(args))


def run_atrest_suite(config: AtRestBenchConfig) -> dict[str, Any]:
    shipped = yaml.safe_load(config.serve_config.read_text())
    with tempfile.TemporaryDirectory(prefix="bench-atrest-") as tmp:
        root = Path(tmp)
        ours_config = ours_serve_config(config, shipped, root / "data")
        with at_rest(config, serve_files.hello_world(free_port()), root / "hello") as (_, hello):
            pass
        with at_rest(config, ours_config, root / "ours") as (served, ours):
            cold = cold_starts(config, served, ours_config)
    difference = _difference(ours, hello)
    log.info(
        "embedding cold starts: p50 %s s, p90 %s s",
        cold.get("p50_s"),
        cold.get("p90_s"),
    )
    log.info(
        "at rest: ours %.3f, hello world %.3f, difference %s of one core (goal <= %g)",
        ours["cpu_share_of_one_core"],
        hello["cpu_share_of_one_core"],
        difference,
        OVER_HELLO_WORLD_TARGET_CORES,
    )
    return {
        "config": config.model_dump(mode="json"),
        "ours": ours,
        "hello_world": hello,
        "difference_cores": difference,
        "embedding_cold_starts": cold,
        "goals": {**goals(ours, hello, difference), **cold_cycles.goals(cold)},
    }


def ours_serve_config(
    config: AtRestBenchConfig, shipped: Mapping[str, Any], data_dir: Path
) -> dict[str, Any]:
    """The shipped config on ports of its own, every model's delays `idle_delay_s` (as shipped
    by default), but the embedding model's `cold_idle_delay_s`: its cold cycles need its pools
    back at zero within a cycle (minutes as shipped). At rest this only changes when that model
    reaches zero, not what its zero costs."""
    copy = serve_files.ours(
        shipped, config.models_dir, data_dir, free_port(), free_port(), config.idle_delay_s
    )
    serve_files.set_model_idle_delay(copy, cold_cycles.COLD_MODEL, config.cold_idle_delay_s)
    return copy


@contextlib.contextmanager
def at_rest(
    config: AtRestBenchConfig, serve_config: Mapping[str, Any], workdir: Path
) -> Iterator[tuple[ServeRun, dict[str, Any]]]:
    """`serve run` of `serve_config` until every model is at zero, settled, then timed; yields
    the run, still up and at zero, with its figures."""
    workdir.mkdir(parents=True)
    models = serve_files.scale_to_zero_deployments(serve_config)
    zero_within_s = serve_files.longest_idle_delay_s(serve_config) + config.zero_margin_s
    started = time.monotonic()
    with serve_run(serve_config, workdir, config.ray_num_cpus, config.start_timeout_s) as run:
        running_s = time.monotonic() - started
        to_zero_s = _wait_for_zero(run, models, zero_within_s)
        time.sleep(config.settle_s)
        left = run.replicas_up(models)
        usage = cpu_share_at_rest(run.pids, config.window_s)
        yield (
            run,
            {
                "running_after_s": round(running_s, 1),
                "models": sum(len(names) for names in models.values()),
                "all_at_zero_after_s": to_zero_s,
                "replicas_left_at_rest": left,
                **usage,
            },
        )


def cold_starts(
    config: ColdCycleSettings,
    served: ServeRun,
    serve_config: Mapping[str, Any],
    request: cold_cycles.ColdRequest = cold_cycles.EMBEDDING_REQUEST,
) -> dict[str, Any]:
    """`request`'s model's cold cycles through the copy's HTTP port (no API key: the copy runs
    open, as the served suites start it without EDGE_API_KEYS); their error, should they fail,
    instead of the figures measured before them."""
    (app,) = serve_config["applications"]
    pools = {
        app["name"]: [d["name"] for d in serve_files.model_deployments(serve_config, request.model)]
    }
    base_url = f"http://{serve_files.LOCALHOST}:{serve_config['http_options']['port']}"
    try:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            part = cold_cycles.ColdCycles(
                client,
                base_url,
                lambda: not served.replicas_up(pools),
                cold_cycles.WallClock(),
                secrets.token_hex(4),
                request,
            )
            return part.run(config)
    except Exception as error:  # the figures before are measured: keep them, say why not these
        log.exception("the %s cold cycles failed", request.model)
        return {"error": repr(error)}


def _wait_for_zero(
    run: ServeRun, models: Mapping[str, list[str]], timeout_s: float
) -> float | None:
    """Seconds until no model has a replica; None if some still had one after `timeout_s`."""
    started = time.monotonic()
    while run.replicas_up(models):
        if time.monotonic() - started > timeout_s:
            return None
        time.sleep(2)
    return round(time.monotonic() - started, 1)


def _difference(ours: Mapping[str, Any], hello: Mapping[str, Any]) -> float:
    return round(ours["cpu_share_of_one_core"] - hello["cpu_share_of_one_core"], 3)


def goals(ours: Mapping[str, Any], hello: Mapping[str, Any], difference: float) -> dict[str, Any]:
    left = sum(ours["replicas_left_at_rest"].values())
    return {
        "cpu_at_rest_over_hello_world": goal(
            difference,
            OVER_HELLO_WORLD_TARGET_CORES,
            "cores",
            at_most=True,
            note="every process of our cluster at rest minus the same for Ray Serve's hello "
            "world, in shares of one core",
            details={
                "ours": ours["cpu_share_of_one_core"],
                "hello_world": hello["cpu_share_of_one_core"],
            },
        ),
        "model_replicas_at_rest": goal(
            left,
            0,
            "replicas",
            at_most=True,
            note="model replicas still up when the window starts (each after its idle delay)",
            details=ours["replicas_left_at_rest"],
        ),
    }
