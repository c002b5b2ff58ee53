"""One local Ray cluster + the real serve_config.yaml (scaled down) per test session, driven with
the same commands the README gives ops: `ray start --head`, `serve deploy`, `serve status`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Ray 2.60 turns token auth on for local clusters; the CLI needs to be told to use it.
RAY_ENV = {**os.environ, "RAY_AUTH_MODE": "token"}
# Replicas inherit the environment `ray start` was given: API keys and the admin API.
ADMIN_KEY = "test-admin-key"
USER_KEY, OTHER_KEY, LIMITED_KEY = "sk-user-1234", "sk-other-5678", "sk-limited-9999"
# Load tests send more than the default 600 requests a minute: as an operator would, they get a
# key without rate limits, so a 429 never passes for a lost request.
LOAD_KEY = "sk-load-0000"
RAY_ENV["EDGE_ADMIN_KEY"] = ADMIN_KEY
RAY_ENV["EDGE_API_KEYS"] = (
    f"user:{USER_KEY},other:{OTHER_KEY},limited:{LIMITED_KEY},load:{LOAD_KEY}"
)
USER = {"authorization": f"Bearer {USER_KEY}"}
LOAD = {"authorization": f"Bearer {LOAD_KEY}"}
LIMITED_RPM = 3
# Every process appends its finished spans here (read where build_app runs: the cluster).
TRACES_FILE = Path(os.environ.get("TMPDIR", "/tmp")) / f"edge-traces-{os.getpid()}.jsonl"
RAY_ENV["EDGE_TRACES_FILE"] = str(TRACES_FILE)
METRICS_PORT = 8089  # outside the worker port range (10002-19999)
KIMI_TO_ZERO_S = 3  # the test config's scale-to-zero delay for kimi


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `disruptive` leave the cluster in a state others must not inherit: last."""
    items.sort(key=lambda item: item.get_closest_marker("disruptive") is not None)


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.5) -> Any:
    """Poll until `check()` returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - keep polling; reported at the deadline
            last_error = exc
        time.sleep(every_s)
    raise AssertionError(
        f"timed out after {timeout_s}s waiting for {what} (last error: {last_error})"
    )


def cli(*args: str, timeout_s: float = 180) -> str:
    done = subprocess.run(
        [str(BIN / args[0]), *args[1:]],
        env=RAY_ENV,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def serve_status() -> dict[str, Any]:
    return yaml.safe_load(cli("serve", "status"))


def running_replicas(deployment: str, app: str = "edge") -> int:
    deployments = serve_status()["applications"][app]["deployments"]
    return deployments[deployment]["replica_states"].get("RUNNING", 0)


@dataclass
class ServeCluster:
    base_url: str
    config_path: Path
    config: dict[str, Any]

    def deploy(self, config: dict[str, Any]) -> None:
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        cli("serve", "deploy", str(self.config_path))
        self.config = config


def scaled_down(config: dict[str, Any], models_root: Path) -> dict[str, Any]:
    """The shipped config with one replica per model at most; kimi starts at zero and goes back
    to zero after a few idle seconds; the simulated RTT is reported but not slept."""
    app = config["applications"][0]
    app["args"]["models_dir"] = str(models_root)
    app["args"]["edge"]["latency"]["real_delay_scale"] = 0
    # Warm-colo preference depends on what each router replica has seen; it is unit-tested
    # (tests/unit/test_edge_dispatch.py). Here routing is by distance alone, so it is exact.
    app["args"]["edge"]["routing"]["max_extra_rtt_ms"] = 0
    app["args"]["security"]["per_key"] = {
        "limited": {"requests_per_minute": LIMITED_RPM},
        "load": {"requests_per_minute": None, "tokens_per_minute": None},
    }
    app["args"]["observability"]["access_log_path"] = str(TRACES_FILE.with_suffix(".access.log"))
    for deployment in app["deployments"]:
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
    cli("ray", "stop", "--force")  # a cluster left by an earlier run would hold the port
    TRACES_FILE.unlink(missing_ok=True)
    cli(
        "ray",
        "start",
        "--head",
        "--disable-usage-stats",
        "--num-cpus",
        "4",
        "--metrics-export-port",
        str(METRICS_PORT),
    )
    try:
        config = scaled_down(yaml.safe_load((REPO / "serve_config.yaml").read_text()), models_root)
        cluster = ServeCluster(
            "http://127.0.0.1:8000", tmp_path_factory.mktemp("serve") / "serve_config.yaml", config
        )
        # The first deploy also starts Serve; on a starved machine its controller may kill a
        # proxy that is slow to pass its health check, failing that deploy: a second one works.
        for attempt in range(3):
            try:
                cluster.deploy(config)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
                time.sleep(5)
        wait_until(
            lambda: serve_status()["applications"]["edge"]["status"] == "RUNNING",
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
        cli("ray", "stop", "--force")
