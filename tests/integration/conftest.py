"""One local Ray cluster + the real serve_config.yaml (scaled down) per test session, driven with
the same commands docs/operating.md gives ops: `ray start --head`, `serve deploy`, `serve status`.
The fixture owns only the cluster it started: another Ray on the machine is left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from deployments.config.state import DATABASE_URL_ENV
from deployments.serve_file import set_router_listener, without_regions
from edgectl.local_cluster import LocalCluster, free_port, wait_until
from edgectl.local_services import PostgresServer, ServiceUnavailable

REPO = Path(__file__).resolve().parents[2]
# Replicas inherit the environment their node was started with: API keys and the admin API. No
# Ray Serve switch: the deployed serve_config.yaml's controller_options set them, as for a user.
ADMIN_KEY = "test-admin-key"
USER_KEY, OTHER_KEY, LIMITED_KEY = "sk-user-1234", "sk-other-5678", "sk-limited-9999"
# Load tests send more than the default 600 requests a minute: as an operator would, they get a
# key without rate limits, so a 429 never passes for a lost request.
LOAD_KEY = "sk-load-0000"
USER = {"authorization": f"Bearer {USER_KEY}"}
LOAD = {"authorization": f"Bearer {LOAD_KEY}"}
LIMITED_RPM = 3
# Every process appends its finished spans here (read where build_app runs: the cluster).
TRACES_FILE = Path(os.environ.get("TMPDIR", "/tmp")) / f"edge-traces-{os.getpid()}.jsonl"
CLUSTER_ENV = {
    "EDGE_ADMIN_KEY": ADMIN_KEY,
    "EDGE_API_KEYS": f"user:{USER_KEY},other:{OTHER_KEY},limited:{LIMITED_KEY},load:{LOAD_KEY}",
    "EDGE_TRACES_FILE": str(TRACES_FILE),
}
KIMI_TO_ZERO_S = 3  # the test config's scale-to-zero delay for kimi


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `disruptive` leave the cluster in a state others must not inherit: last."""
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)


@dataclass
class ServeCluster:
    """The session's own Ray cluster (see edgectl.local_cluster) running the edge app, its
    gateway state on a PostgreSQL of its own (None where the machine has none: SQLite)."""

    ray: LocalCluster
    base_url: str
    config_path: Path
    config: dict[str, Any]
    postgres: PostgresServer | None = None
    no_postgres: str = ""  # why there is none (the missing binaries)

    @property
    def env(self) -> dict[str, str]:
        """What an operator's shell has: the cluster's address and token settings."""
        return self.ray.env

    @property
    def listener_url(self) -> str:
        """The router replicas' own port (router.listener), beside Serve's proxy."""
        listener = self.config["applications"][0]["args"]["router"]["listener"]
        return f"http://127.0.0.1:{listener['port']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ray.metrics_port}/metrics"

    def cli(self, *args: str, timeout_s: float = 180) -> str:
        return self.ray.cli(*args, timeout_s=timeout_s)

    def serve_status(self) -> dict[str, Any]:
        return yaml.safe_load(self.cli("serve", "status"))

    def running_replicas(self, deployment: str, app: str = "edge") -> int:
        deployments = self.serve_status()["applications"][app]["deployments"]
        return deployments[deployment]["replica_states"].get("RUNNING", 0)

    def replica_actors(self, deployment: str, app: str = "edge") -> list[str]:
        """The names of the deployment's live replica actors."""
        alive = ("--filter", "state=ALIVE", "--format", "yaml", "--limit", "500")
        listed = yaml.safe_load(self.cli("ray", "list", "actors", *alive))
        prefix = f"SERVE_REPLICA::{app}#{deployment}#"
        return sorted(a["name"] for a in listed or [] if (a.get("name") or "").startswith(prefix))

    def kill_actor(self, name: str) -> None:
        """A crash of one replica (no goodbye); Serve's controller starts a new one."""
        self.cli("python", "-c", KILL_ACTOR.format(name=name), timeout_s=60)

    def deploy(self, config: dict[str, Any], attempts: int = 1) -> None:
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.ray.serve_deploy(self.config_path, attempts)
        self.config = config


KILL_ACTOR = """
import os, ray
os.environ["RAY_AUTH_MODE"] = "token"
ray.init(address="auto", logging_level="ERROR")
ray.kill(ray.get_actor("{name}", namespace="serve"), no_restart=True)
"""


def scaled_down(
    config: dict[str, Any], models_root: Path, http_port: int, data_dir: Path
) -> dict[str, Any]:
    """The shipped config with one replica per model at most, glm with a KV budget; kimi starts
    at zero and goes back to zero after a few idle seconds; the simulated RTT is reported but
    not slept; state (the response cache's SQLite file) in the session's own `data_dir`."""
    # One pool per model, as a config without regions has: regions get clusters of their own
    # (test_regions.py, test_region_outage.py).
    config = without_regions(config, home="eu")
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1"}
    config["http_options"]["port"] = http_port
    app = config["applications"][0]
    app["args"]["models_dir"] = str(models_root)
    app["args"]["data_dir"] = str(data_dir)
    # A loaded machine can stall the cache's SQLite thread past the shipped bound; how a slow
    # backend becomes a miss is unit-tested, here a repeat must find what was stored.
    app["args"]["router"]["cache"]["timeout_ms"] = 5000
    app["args"]["edge"]["latency"]["real_delay_scale"] = 0
    # The routers' own port too (off as shipped), so every test's redeploy and restart runs
    # with it; test_live_listener.py sends requests to it.
    set_router_listener(app["args"], free_port())
    # Warm-colo preference depends on what each router replica has seen; it is unit-tested
    # (tests/unit/test_edge_dispatch.py). Here routing is by distance alone, so it is exact.
    app["args"]["edge"]["routing"]["max_extra_rtt_ms"] = 0
    app["args"]["security"]["per_key"] = {
        "limited": {"requests_per_minute": LIMITED_RPM},
        "load": {"requests_per_minute": None, "tokens_per_minute": None},
    }
    app["args"]["observability"]["access_log_path"] = str(TRACES_FILE.with_suffix(".access.log"))
    for deployment in app["deployments"]:
        if deployment["name"] == "glm":
            # A KV budget the tiny model never reaches: its gauge and admission path run live.
            deployment["user_config"] = {**deployment.get("user_config", {}), "kv_budget_mb": 256}
        scaling = deployment.get("autoscaling_config")
        if scaling:
            scaling["max_replicas"] = 1
            scaling["initial_replicas"] = 0 if deployment["name"] == "kimi" else 1
            if deployment["name"] == "kimi":
                scaling["downscale_delay_s"] = KIMI_TO_ZERO_S
                scaling["downscale_to_zero_delay_s"] = KIMI_TO_ZERO_S
    return config


@pytest.fixture(scope="session")
def serve_cluster(
    models_root: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServeCluster]:
    """Its own Ray (temp dir, free ports, own process groups), stopped by its own process ids:
    another Ray on this machine is never touched. The routers keep gateway state in a
    PostgreSQL of the session's own (EDGE_DATABASE_URL), so a test can kill the database under
    load; SQLite, the default, is covered by the unit tests."""
    TRACES_FILE.unlink(missing_ok=True)
    try:
        postgres: PostgresServer | None = PostgresServer.start()
        no_postgres = ""
    except ServiceUnavailable as absent:  # the tests that need it say so (test_gateway_state)
        postgres, no_postgres = None, str(absent)
    env = dict(CLUSTER_ENV)
    if postgres is not None:
        env[DATABASE_URL_ENV] = postgres.dsn
    try:
        ray = LocalCluster.start(num_cpus=4, env=env)
    except BaseException:
        if postgres is not None:
            postgres.remove()
        raise
    try:
        http_port = free_port()
        config = scaled_down(
            yaml.safe_load((REPO / "serve_config.yaml").read_text()),
            models_root,
            http_port,
            tmp_path_factory.mktemp("data"),
        )
        # Never the repository's data/ (a developer's own gateway state lives there).
        config["applications"][0]["args"]["data_dir"] = str(tmp_path_factory.mktemp("data"))
        cluster = ServeCluster(
            ray,
            f"http://127.0.0.1:{http_port}",
            tmp_path_factory.mktemp("serve") / "serve_config.yaml",
            config,
            postgres,
            no_postgres,
        )
        cluster.deploy(config, attempts=3)  # the first deploy also starts Serve
        wait_until(
            lambda: cluster.serve_status()["applications"]["edge"]["status"] == "RUNNING",
            timeout_s=240,
            what="the edge application to be RUNNING",
            every_s=1,
        )
        wait_until(
            lambda: httpx.get(f"{cluster.base_url}/healthz", timeout=5).status_code == 200,
            timeout_s=60,
            what="the router to answer",
        )
        yield cluster
    finally:
        ray.stop()
        if postgres is not None:
            postgres.remove()


def kimi_burst_after_idle(
    cluster: ServeCluster,
    out: Path,
    *,
    duration_s: float,
    replicas_every_s: float,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """The load tester's cold-start scenario as an operator runs it, on kimi: at zero, primed
    once, idle past its scale-to-zero delay, then a 4 requests/s burst. Its summary.json."""
    wait_until(lambda: cluster.running_replicas("kimi") == 0, 90, "kimi at zero replicas")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "edgectl.loadtest",
            "--scenario=burst-after-idle",
            f"--url={cluster.base_url}",
            f"--out={out}",
            "--models=kimi",
            f"--api-key={USER_KEY}",
            "--warm-s=1",
            f"--idle-s={KIMI_TO_ZERO_S + 12}",
            "--rate=4",
            f"--duration-s={duration_s}",
            "--max-tokens=4",
            f"--replicas-every-s={replicas_every_s}",
            "--no-progress",
            *extra,
        ],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return dict(json.loads((out / "summary.json").read_text()))
