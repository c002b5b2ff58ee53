"""The front-door suite (issue 43): `serve run` of a temp copy of serve_config.yaml (HAProxy on its
HTTP port, as shipped; its own ports and folders, keys for the load and the admin API) under mixed
load (load.py), and one process killed at a time with SIGKILL (victims.py), each followed by load
until the front door has settled; then per kill what the clients saw (windows.py)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import secrets
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from benchmarks.atrest import serve_files
from benchmarks.atrest.serve_run import ServeRun, serve_run
from benchmarks.front_door.config import FrontDoorBenchConfig, Target
from benchmarks.front_door.load import CHAT, EMBEDDING, FrontDoorLoad
from benchmarks.front_door.redeploy import serve_deploy
from benchmarks.front_door.victims import APP, Victim, is_running, kill_one
from benchmarks.front_door.windows import Kill, by_window, goals
from benchmarks.lib.http_load import Clock, Endpoint, async_client, ready
from edgectl.local_cluster import free_port

log = logging.getLogger(__name__)

NEEDS_RAY = True
LOAD_KEY_NAME = "bench"
HEALTH_CHECK_PERIOD = "RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S"
SETTLE_POLL_S = 1.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    return run_front_door_suite(FrontDoorBenchConfig.from_args(args))


def serve_config_copy(
    shipped: Mapping[str, Any],
    config: FrontDoorBenchConfig,
    data_dir: Path,
    http_port: int,
    listener_port: int,
) -> dict[str, Any]:
    """The shipped config as the at-rest suite runs it (its own ports and folders), the load's key
    unlimited (the shipped default allows 600 requests a minute per key) and, on request, Serve's
    proxy health check period in the controller's environment."""
    copy = serve_files.ours(
        shipped, config.models_dir, data_dir, http_port, listener_port, idle_delay_s=None
    )
    for app in copy["applications"]:
        security = app["args"].setdefault("security", {})
        security["per_key"] = {
            LOAD_KEY_NAME: {"requests_per_minute": None, "tokens_per_minute": None}
        }
    if config.proxy_health_check_period_s is not None:
        options = copy.setdefault("controller_options", {})
        env_vars = options.setdefault("runtime_env", {}).setdefault("env_vars", {})
        env_vars[HEALTH_CHECK_PERIOD] = f"{config.proxy_health_check_period_s:g}"
    return copy


def run_front_door_suite(config: FrontDoorBenchConfig) -> dict[str, Any]:
    shipped = yaml.safe_load(config.serve_config.read_text(encoding="utf-8"))
    user_key, admin_key = f"sk-bench-{secrets.token_hex(8)}", secrets.token_hex(16)
    env = {"EDGE_API_KEYS": f"{LOAD_KEY_NAME}:{user_key}", "EDGE_ADMIN_KEY": admin_key}
    http_port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-front-door-") as tmp:
        root = Path(tmp)
        serve_config = serve_config_copy(shipped, config, root / "data", http_port, free_port())
        (root / "run").mkdir()
        with serve_run(
            serve_config, root / "run", config.ray_num_cpus, config.start_timeout_s, env
        ) as running:
            load = FrontDoorLoad(
                f"http://127.0.0.1:{http_port}", user_key, admin_key, config, _clock()
            )
            kills = asyncio.run(kill_in_turn(running, load, config, serve_config, root / "run"))
    end_s = load.clock()
    windows = by_window(load.outcomes, kills, end_s)
    return {
        "config": config.model_dump(mode="json"),
        "serve_switches": serve_config.get("controller_options", {})
        .get("runtime_env", {})
        .get("env_vars", {}),
        "kills": [dataclasses.asdict(kill) for kill in kills],
        "windows": windows,
        "goals": goals(windows, kills),
    }


def _clock() -> Clock:
    """Seconds since the suite's load was set up: every Outcome and Kill is on this clock."""
    started = time.monotonic()
    return lambda: time.monotonic() - started


async def kill_in_turn(
    running: ServeRun,
    load: FrontDoorLoad,
    config: FrontDoorBenchConfig,
    serve_config: Mapping[str, Any],
    workdir: Path,
) -> list[Kill]:
    """Load from the start; each target killed (or `serve deploy` run) in turn once the front
    door has settled."""

    def disrupt(target: Target) -> Victim:
        if target == "serve-deploy":
            return serve_deploy(running, serve_config, workdir)
        return kill_one(target, running.pids())

    await _first_answers(load.base_url, load.user_key, config.chat_max_tokens)
    clients = asyncio.create_task(load.run())
    kills: list[Kill] = []
    try:
        await asyncio.sleep(config.warmup_s)
        for target in config.targets:
            at_s = load.clock()
            victim = await asyncio.to_thread(disrupt, target)
            log.info(
                "front door: killed %s at %.1f s: pid %s %s", target, at_s, victim.pid, victim.title
            )
            await asyncio.sleep(config.after_kill_s)
            settled = victim.pid is not None and await _settled(running, load, target, config)
            if not settled:
                log.warning("front door: %s's kill not settled: the next goes on", target)
            kills.append(Kill(target, at_s, victim.pid, settled, victim.title))
    finally:
        load.stop()
        await clients
    return kills


async def _first_answers(base_url: str, user_key: str, max_tokens: int) -> None:
    """Before any load: both models answer (a replica may still be starting)."""
    headers = {"authorization": f"Bearer {user_key}"}
    embedding = {"model": EMBEDDING[1], "input": "ready"}
    chat = {"model": CHAT[1], "messages": [{"role": "user", "content": "ready"}]}
    async with async_client(1) as client:
        await ready(client, Endpoint(base_url + EMBEDDING[0], headers), embedding)
        await ready(
            client, Endpoint(base_url + CHAT[0], headers), {**chat, "max_tokens": max_tokens}
        )


async def _settled(
    running: ServeRun, load: FrontDoorLoad, target: Target, config: FrontDoorBenchConfig
) -> bool:
    """Until no request failed and no connection was refused for settled_s, the killed target
    runs again (a deploy: nothing to restart) and the application is RUNNING; False after
    recover_timeout_s."""
    deadline = load.clock() + config.recover_timeout_s
    while load.clock() < deadline:
        last_bad = load.last_bad_s()
        quiet = last_bad is None or load.clock() - last_bad >= config.settled_s
        if (
            quiet
            and (
                target == "serve-deploy"
                or await asyncio.to_thread(is_running, target, running.pids())
            )
            and await asyncio.to_thread(running.running, [APP])
        ):
            return True
        await asyncio.sleep(SETTLE_POLL_S)
    return False
