"""A benchmark's own Ray + Serve: started beside (never attached to) any other cluster on the
machine, fed Serve config applications the way `serve deploy` is, and always shut down."""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import ray
from ray import serve
from ray.serve.context import _get_global_client
from ray.serve.schema import ApplicationStatus, DeploymentStatus, ServeDeploySchema

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.5


@contextlib.contextmanager
def private_serve(num_cpus: int, http_port: int) -> Iterator[None]:
    """Ray with `address="local"` (a new cluster, whatever RAY_ADDRESS says) and Serve on
    127.0.0.1:`http_port`; both are shut down whatever happens inside."""
    log.info("starting a private Ray (%d CPUs) and Serve on :%d", num_cpus, http_port)
    # A SIGTERM (`timeout`, a CI cancel) must still run the shutdown below, or Ray's processes
    # outlive us.
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            log_to_driver=False,  # replica access logs would drown the progress lines
        )
    except BaseException:
        signal.signal(signal.SIGTERM, previous_handler)
        raise
    # Only once our own Ray is up: serve.shutdown() without it would attach to another cluster.
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": http_port})
        yield
    finally:
        with contextlib.suppress(Exception):  # Serve may never have started
            serve.shutdown()
        ray.shutdown()
        signal.signal(signal.SIGTERM, previous_handler)
        log.info("private Ray shut down")


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def apply_applications(
    applications: Sequence[dict[str, Any]], http_port: int, timeout_s: float
) -> None:
    """Deploy Serve config `applications` (the `applications:` entries of a config file) as
    `serve deploy` does: Serve diffs them against what runs, so a change of user_config alone
    reconfigures live replicas, and applications left out are deleted. Returns once all run."""
    schema = ServeDeploySchema.model_validate(
        {
            "proxy_location": "HeadOnly",
            "http_options": {"host": "127.0.0.1", "port": http_port},
            "applications": list(applications),
        }
    )
    names = [app["name"] for app in applications]
    log.info("deploying %s", ", ".join(names))
    started = time.monotonic()
    # serve.run would give every deployment a new random code version (a restart); the config
    # path is the one ops use, and the private client is how `serve run config.yaml` reaches it.
    _get_global_client().deploy_apps(schema)
    wait_until(lambda: _all_running(names), timeout_s, f"applications {names} to be RUNNING")
    log.info("running after %.1fs", time.monotonic() - started)


def _all_running(names: Sequence[str]) -> bool:
    applications = serve.status().applications
    for name in names:
        app = applications.get(name)
        if app is None:
            return False
        if app.status == ApplicationStatus.DEPLOY_FAILED:
            raise RuntimeError(f"application {name} failed to deploy: {app.message}")
        if app.status != ApplicationStatus.RUNNING or any(
            d.status != DeploymentStatus.HEALTHY for d in app.deployments.values()
        ):
            return False
    return True


def wait_until(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll `check()` until it returns something truthy (returned); TimeoutError at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
