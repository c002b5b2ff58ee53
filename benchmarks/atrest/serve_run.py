"""One side of the at-rest comparison: a private Ray (edgectl.local_cluster: its own temp dir,
ports and process groups) and `serve run <config>` against it, as an operator starts a platform;
every process of both is what the suite times."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from edgectl.local_cluster import LocalCluster, running
from edgectl.ray_node import session_pids

log = logging.getLogger(__name__)

SERVE = Path(sys.executable).parent / "serve"
REPO = Path(__file__).resolve().parents[2]
# `serve run` shuts Serve down on Ctrl-C; past this its process group is ended by signal.
SERVE_RUN_STOP_S = 30
START_ATTEMPTS = 3
UP_STATES = ("STARTING", "RUNNING", "UPDATING", "RECOVERING", "STOPPING", "PENDING_MIGRATION")


class ServeRunExited(RuntimeError):
    """`serve run` ended before its applications ran."""


@dataclass
class ServeRun:
    """A started `serve run` and the cluster it runs on."""

    cluster: LocalCluster
    process: subprocess.Popen[bytes]
    log_path: Path

    def pids(self) -> list[int]:
        """Every process of the cluster's nodes and of `serve run` (the driver watching it)."""
        found = [pid for node in self.cluster.nodes for pid in node.pids("")]
        return found + session_pids(self.process.pid)

    def applications(self) -> dict[str, Any]:
        """Serve's applications from the dashboard; none while it does not answer yet."""
        try:
            return dict(self.cluster.serve_applications().get("applications") or {})
        except httpx.HTTPError:
            return {}

    def replicas_up(self, deployments: Mapping[str, list[str]]) -> dict[str, int]:
        """Replicas not yet gone, per deployment of `deployments` (app -> names) that has any."""
        applications = self.applications()
        up = {}
        for app, names in deployments.items():
            details = applications.get(app, {}).get("deployments", {})
            for name in names:
                replicas = details.get(name, {}).get("replicas", [])
                count = sum(1 for r in replicas if r.get("state") in UP_STATES)
                if count:
                    up[name] = count
        return up

    def running(self, names: list[str]) -> bool:
        if self.process.poll() is not None:
            raise ServeRunExited(f"serve run exited ({self.process.returncode}): {self.log_tail()}")
        applications = self.applications()
        return all(applications.get(n, {}).get("status") == "RUNNING" for n in names)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


@contextlib.contextmanager
def serve_run(
    config: Mapping[str, Any],
    workdir: Path,
    num_cpus: float,
    start_timeout_s: float,
    env: Mapping[str, str] | None = None,
) -> Iterator[ServeRun]:
    """`serve run` of `config` (written under `workdir`) on a cluster of its own (started with
    `env` beside its own settings: keys, say), until every application in it is RUNNING; on the
    way out Serve is shut down and the cluster stopped. At
    load 30-50 on 2 cores a head has died under `serve run` (its GCS gone): that cluster is
    stopped and another started, up to START_ATTEMPTS times."""
    config_path = workdir / "serve_config.yaml"
    config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
    names = [app["name"] for app in config["applications"]]
    for attempt in range(1, START_ATTEMPTS + 1):
        with running(num_cpus=num_cpus, env=env) as cluster:
            run = ServeRun(
                cluster, _start(config_path, cluster, workdir), workdir / "serve_run.log"
            )
            try:
                log.info("serve run %s (%s)", config_path, ", ".join(names))
                try:
                    _wait_running(run, names, start_timeout_s)
                except ServeRunExited as exited:
                    if attempt == START_ATTEMPTS:
                        raise
                    log.warning("start %d failed, a new cluster: %s", attempt, exited)
                    continue
                yield run
                return
            finally:
                _stop(run.process)


def _start(config_path: Path, cluster: LocalCluster, workdir: Path) -> subprocess.Popen[bytes]:
    with (workdir / "serve_run.log").open("ab") as out:
        return subprocess.Popen(
            [str(SERVE), "run", str(config_path)],
            cwd=REPO,
            env=cluster.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group: ours alone to signal
        )


def _wait_running(run: ServeRun, names: list[str], timeout_s: float) -> None:
    """Until every application in `names` is RUNNING; at once if `serve run` exits."""
    deadline = time.monotonic() + timeout_s
    while not run.running(names):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{names} not RUNNING after {timeout_s:g} s: {run.log_tail()}")
        time.sleep(1)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C, as an operator stops `serve run` (it shuts Serve down); then its whole group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=SERVE_RUN_STOP_S)
    except subprocess.TimeoutExpired:
        log.warning("serve run did not stop on Ctrl-C in %d s: ended by signal", SERVE_RUN_STOP_S)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
