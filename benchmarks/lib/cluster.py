"""A benchmark's own Ray + Serve: an `edgectl.local_cluster` cluster (its own temp dir, free ports
and process groups, so never another Ray on this machine), this process attached to it as the
driver, and Serve config applications deployed the way `serve deploy` does."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import ray
from ray import serve
from ray.serve.schema import ApplicationStatus, DeploymentStatus, ServeDeploySchema

from deployments.ray_ext.driver import deploy_applications, reload_driver_auth
from edgectl.local_cluster import LocalCluster, running, wait_until

log = logging.getLogger(__name__)

# What a driver needs to reach the cluster: the address and the cluster's own token.
DRIVER_ENV = ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")
CLUSTER_ATTEMPTS = 3


@contextlib.contextmanager
def serve_cluster(
    num_cpus: float,
    http_port: int,
    env: Mapping[str, str] | None = None,
    controller_options: Mapping[str, Any] | None = None,
) -> Iterator[LocalCluster]:
    """Start a cluster the plain way (`env`, when given, reaches the raylet and every replica,
    e.g. RAY_* worker pool settings or EDGE_ADMIN_KEY), attach to it, start Serve on
    127.0.0.1:`http_port` (with a config file's `controller_options`, as `serve run`/`serve
    deploy` do: Ray Serve's switches come from there); stop it all whatever happens inside."""
    log.info("starting a private Ray (%g CPUs) and Serve on :%d", num_cpus, http_port)
    env = dict(env or {})
    # A SIGTERM (`timeout`, a CI cancel) must still run the shutdown below: the cluster lives in
    # process groups of its own and would outlive us.
    previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    saved_env = {key: os.environ.get(key) for key in DRIVER_ENV}
    try:
        with _attached_cluster(num_cpus, env) as cluster:
            try:
                serve.start(
                    http_options={"host": "127.0.0.1", "port": http_port},
                    controller_options=dict(controller_options) if controller_options else None,
                )
                yield cluster
            finally:
                ray.shutdown()  # detach; stopping the cluster ends Serve with it
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reload_driver_auth()
        signal.signal(signal.SIGTERM, previous_handler)
        log.info("private Ray stopped")


@contextlib.contextmanager
def _attached_cluster(num_cpus: float, env: Mapping[str, str]) -> Iterator[LocalCluster]:
    """A started cluster with this process attached as its driver. At load 40-130 here, a head
    node that `ray start` reported up died seconds later (its raylet aborts when its dashboard
    agent misses a fixed 15 s wait) and the driver could not attach: that cluster is stopped and
    another started, up to CLUSTER_ATTEMPTS times."""
    for attempt in range(1, CLUSTER_ATTEMPTS + 1):
        with running(num_cpus=num_cpus, env=env) as cluster:
            os.environ.update({key: cluster.env[key] for key in DRIVER_ENV})
            reload_driver_auth()
            try:
                ray.init(address=cluster.gcs_address, log_to_driver=False)
            except ConnectionError:
                ray.shutdown()  # whatever the failed attach left set up in this process
                if attempt == CLUSTER_ATTEMPTS:
                    raise
                log.warning("could not attach to the private Ray (start %d); a new one", attempt)
                continue
            yield cluster
            return


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
    # path is the one ops use.
    deploy_applications(schema)
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
