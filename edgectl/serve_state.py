"""Ray Serve's state as `serve status` shows it, read from the Ray dashboard's REST API
(`GET /api/serve/applications/`: one HTTP call, no `serve` process), and the scale-to-zero delays
of serve_config.yaml. Plain HTTP and YAML: nothing here imports Ray."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import httpx

DEFAULT_APP = "edge"
DEFAULT_DASHBOARD = "http://127.0.0.1:8265"
SERVE_APPLICATIONS_PATH = "/api/serve/applications/"
# Replicas on their way down or gone; the others are running or on their way up.
LEAVING_STATES = frozenset({"STOPPING", "STOPPED"})
# Ray Serve's AutoscalingConfig defaults, for fields serve_config.yaml leaves out.
RAY_DEFAULT_MIN_REPLICAS = 1
RAY_DEFAULT_DOWNSCALE_DELAY_S = 600.0


class ServeStatusError(RuntimeError):
    """The dashboard did not answer, or answered something other than our application's state."""


@dataclass(frozen=True, slots=True)
class DeploymentState:
    name: str
    status: str  # HEALTHY, UPSCALING, DOWNSCALING, UPDATING, UNHEALTHY, ...
    replica_states: Mapping[str, int]
    wanted: int  # the controller's target (autoscaling decision included)
    message: str = ""

    @property
    def running(self) -> int:
        return self.replica_states.get("RUNNING", 0)


@dataclass(frozen=True, slots=True)
class ApplicationState:
    name: str
    status: str
    message: str
    deployments: Mapping[str, DeploymentState]


def parse_serve_applications(data: Any, app: str = DEFAULT_APP) -> ApplicationState:
    """Our application's part of the dashboard's Serve details (Ray's ServeInstanceDetails JSON).
    Raises ServeStatusError."""
    applications = data.get("applications") if isinstance(data, Mapping) else None
    if not isinstance(applications, Mapping):
        raise ServeStatusError("the dashboard sent no 'applications' mapping")
    found = applications.get(app)
    if not isinstance(found, Mapping):
        raise ServeStatusError(
            f"no application {app!r} on this cluster (has {sorted(applications)})"
        )
    deployments = {}
    for name, info in sorted((found.get("deployments") or {}).items()):
        info = info if isinstance(info, Mapping) else {}
        states: dict[str, int] = {}
        for replica in info.get("replicas") or []:
            state = str(replica.get("state", "UNKNOWN"))
            states[state] = states.get(state, 0) + 1
        target = info.get("target_num_replicas")
        deployments[str(name)] = DeploymentState(
            name=str(name),
            status=str(info.get("status", "UNKNOWN")),
            replica_states=MappingProxyType(states),
            wanted=int(target)
            if isinstance(target, int)
            else sum(n for s, n in states.items() if s not in LEAVING_STATES),
            message=str(info.get("message") or ""),
        )
    return ApplicationState(
        name=app,
        status=str(found.get("status", "UNKNOWN")),
        message=str(found.get("message") or ""),
        deployments=MappingProxyType(deployments),
    )


def ray_auth_token(env: Mapping[str, str] | None = None, home: Path | None = None) -> str | None:
    """The token Ray's own CLI would send: RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH
    names, else ~/.ray/auth_token; None when there is none (a cluster without token auth)."""
    env = os.environ if env is None else env
    if env.get("RAY_AUTH_TOKEN"):
        return env["RAY_AUTH_TOKEN"].strip()
    path = (
        Path(env["RAY_AUTH_TOKEN_PATH"])
        if env.get("RAY_AUTH_TOKEN_PATH")
        else (home or Path.home()) / ".ray" / "auth_token"
    )
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def default_dashboard(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("RAY_DASHBOARD_ADDRESS") or DEFAULT_DASHBOARD


class ServeDashboard:
    """Reads our application's state with one GET per call; keeps its connection open."""

    def __init__(
        self,
        address: str | None = None,
        *,
        app: str = DEFAULT_APP,
        token: str | None = None,
        timeout_s: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.address = address or default_dashboard()
        self.app = app
        token = token if token is not None else ray_auth_token()
        self._client = httpx.Client(
            base_url=self.address,
            headers={"authorization": f"Bearer {token}"} if token else {},
            timeout=timeout_s,
            transport=transport,
            trust_env=False,
        )

    def __call__(self) -> ApplicationState:
        try:
            response = self._client.get(SERVE_APPLICATIONS_PATH)
        except httpx.HTTPError as error:
            raise ServeStatusError(f"Ray dashboard at {self.address}: {error}") from None
        if response.status_code in (401, 403):
            raise ServeStatusError(
                f"Ray dashboard at {self.address} refused the token ({response.status_code}): "
                "set RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
            )
        if response.status_code != 200:
            raise ServeStatusError(
                f"Ray dashboard at {self.address}: HTTP {response.status_code} "
                f"{response.text[:200]}"
            )
        try:
            data = response.json()
        except ValueError:
            raise ServeStatusError(f"Ray dashboard at {self.address} sent no JSON") from None
        return parse_serve_applications(data, self.app)

    def close(self) -> None:
        self._client.close()


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
