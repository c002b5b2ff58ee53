"""A served suite's cluster: our application (benchmarks.lib.edge_app) and the suite's baselines
deployed in one private Ray + Serve (benchmarks.lib.cluster), behind one proxy, with the ingress
and transport switches the suite's settings name."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from benchmarks.lib import processes
from benchmarks.lib.cluster import apply_applications, serve_cluster
from benchmarks.lib.config import INGRESS_ENV, Ingress, ServedBenchConfig
from edgectl.local_cluster import free_port

log = logging.getLogger(__name__)


@contextlib.contextmanager
def served(
    config: ServedBenchConfig, applications: Sequence[dict[str, Any]]
) -> Iterator[tuple[str, int]]:
    """Start the cluster, deploy `applications` (ours first: baselines may look its deployments
    up by name), yield (base URL, HTTP port); stop it all whatever happens inside."""
    # Quiet: httpx logs one INFO line per request.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    http_port = free_port()
    with (
        _ingress_env(config.ingress, http_port),
        serve_cluster(
            config.ray_num_cpus, http_port, controller_options=config.controller_options()
        ),
    ):
        apply_applications(applications, http_port, config.deploy_timeout_s)
        log.info("running: %s", ray_workers())
        yield f"http://127.0.0.1:{http_port}", http_port


@contextlib.contextmanager
def _ingress_env(ingress: Ingress, http_port: int) -> Iterator[None]:
    """The switches must be in the environment Ray's processes inherit from this driver."""
    changes = dict(INGRESS_ENV[ingress])
    if ingress in ("direct", "haproxy"):
        # Replicas that take HTTP themselves bind ports from a range (30000+ by default, which
        # another Serve on the machine may hold): ours sit just above our own HTTP port.
        changes |= {
            "RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": str(http_port + 100),
            "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": str(http_port + 199),
            "RAY_SERVE_DIRECT_INGRESS_MIN_GRPC_PORT": str(http_port + 200),
            "RAY_SERVE_DIRECT_INGRESS_MAX_GRPC_PORT": str(http_port + 299),
        }
    if ingress == "haproxy":
        # Per-run paths: Serve's defaults under /tmp/haproxy-serve would collide with any other
        # HAProxy-fronted Serve on the machine.
        state = f"/tmp/haproxy-serve-{os.getpid()}"
        changes |= {
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{state}/haproxy.cfg",
            "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{state}/admin.sock",
            "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": state,
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{state}/server-state",
        }
    saved = {name: os.environ.get(name) for name in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def ray_workers() -> dict[str, int]:
    """The Ray workers of this private cluster by title: which replicas the figures read."""
    counts: dict[str, int] = {}
    for info in processes.descendants(os.getpid(), processes.processes()):
        if info.title.startswith("ray::"):
            title = info.title.split()[0]
            counts[title] = counts.get(title, 0) + 1
    return dict(sorted(counts.items()))
