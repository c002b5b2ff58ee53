"""Ray Serve's state as its own CLI prints it (`serve status`, run as a subprocess) and the
scale-to-zero delays of serve_config.yaml. Plain YAML reading: nothing here imports Ray."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

DEFAULT_APP = "edge"
# Replicas on their way down or gone; every other state is one the controller wants to exist.
LEAVING_STATES = frozenset({"STOPPING", "STOPPED"})
# Ray Serve's AutoscalingConfig defaults, for fields serve_config.yaml leaves out.
RAY_DEFAULT_MIN_REPLICAS = 1
RAY_DEFAULT_DOWNSCALE_DELAY_S = 600.0


class ServeStatusError(RuntimeError):
    """`serve status` failed or printed something other than the status of our application."""


@dataclass(frozen=True, slots=True)
class DeploymentState:
    name: str
    status: str  # HEALTHY, UPSCALING, DOWNSCALING, UPDATING, UNHEALTHY, ...
    replica_states: Mapping[str, int]
    message: str = ""

    @property
    def running(self) -> int:
        return self.replica_states.get("RUNNING", 0)

    @property
    def wanted(self) -> int:
        """Replicas the controller keeps or is starting (all but the stopping ones): its target
        once a scaling decision has been acted on. `serve status` prints no target itself."""
        return sum(n for state, n in self.replica_states.items() if state not in LEAVING_STATES)


@dataclass(frozen=True, slots=True)
class ApplicationState:
    name: str
    status: str
    message: str
    deployments: Mapping[str, DeploymentState]


def parse_serve_status(text: str, app: str = DEFAULT_APP) -> ApplicationState:
    """The application's part of `serve status` output (YAML). Raises ServeStatusError."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ServeStatusError(f"serve status printed invalid YAML: {error}") from None
    applications = data.get("applications") if isinstance(data, dict) else None
    if not isinstance(applications, dict):
        raise ServeStatusError("serve status printed no 'applications' mapping")
    found = applications.get(app)
    if not isinstance(found, dict):
        raise ServeStatusError(
            f"no application {app!r} in serve status (has {sorted(applications)})"
        )
    deployments = {}
    for name, info in sorted((found.get("deployments") or {}).items()):
        info = info if isinstance(info, dict) else {}
        states = info.get("replica_states") or {}
        deployments[str(name)] = DeploymentState(
            name=str(name),
            status=str(info.get("status", "UNKNOWN")),
            replica_states=MappingProxyType({str(s): int(n) for s, n in states.items()}),
            message=str(info.get("message") or ""),
        )
    return ApplicationState(
        name=app,
        status=str(found.get("status", "UNKNOWN")),
        message=str(found.get("message") or ""),
        deployments=MappingProxyType(deployments),
    )


def default_serve_command() -> list[str]:
    """`serve status` from this interpreter's environment when it has the CLI, else from PATH."""
    beside = Path(sys.executable).parent / "serve"
    return [str(beside) if beside.is_file() else shutil.which("serve") or "serve", "status"]


Runner = Callable[..., subprocess.CompletedProcess[str]]


class ServeStatusCommand:
    """Runs `serve status` and parses it. The command is injectable, e.g. to reach a cluster
    through `kubectl exec <head-pod> -- serve status`, or `cat file.yaml` in tests."""

    def __init__(
        self,
        command: Sequence[str] | None = None,
        *,
        app: str = DEFAULT_APP,
        timeout_s: float = 30.0,
        env: Mapping[str, str] | None = None,
        run: Runner = subprocess.run,
    ):
        self.command = list(command) if command else default_serve_command()
        self.app = app
        self._timeout_s = timeout_s
        # Ray 2.60 turns token auth on for local clusters; its CLI must be told to use it.
        self._env = {**(os.environ if env is None else env), "RAY_AUTH_MODE": "token"}
        self._run = run

    def __call__(self) -> ApplicationState:
        try:
            done = self._run(
                self.command,
                env=self._env,
                capture_output=True,
                text=True,
                timeout=self._timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ServeStatusError(f"{' '.join(self.command)}: {error}") from None
        if done.returncode != 0:
            # The last line of a Python traceback is the error itself.
            lines = (done.stderr or done.stdout or "").strip().splitlines()
            raise ServeStatusError(
                f"{' '.join(self.command)} exited {done.returncode}: "
                f"{lines[-1].strip() if lines else '(no output)'}"
            )
        return parse_serve_status(done.stdout, self.app)


def scale_to_zero_delays_s(
    serve_config: Mapping[str, Any], models: Iterable[str], app: str = DEFAULT_APP
) -> dict[str, float | None]:
    """Seconds of silence after which each model's last replica stops, per serve_config.yaml;
    None for a model that never scales to zero (fixed replicas, or min_replicas > 0)."""
    deployments: dict[str, Mapping[str, Any]] = {}
    for application in serve_config.get("applications") or []:
        if application.get("name", "default") == app:
            deployments = {d["name"]: d for d in application.get("deployments") or []}
    delays: dict[str, float | None] = {}
    for model in models:
        scaling = deployments.get(model, {}).get("autoscaling_config")
        if not isinstance(scaling, Mapping):
            delays[model] = None
            continue
        if scaling.get("min_replicas", RAY_DEFAULT_MIN_REPLICAS) > 0:
            delays[model] = None
            continue
        delay = scaling.get("downscale_to_zero_delay_s")
        if delay is None:
            delay = scaling.get("downscale_delay_s", RAY_DEFAULT_DOWNSCALE_DELAY_S)
        delays[model] = float(delay)
    return delays
