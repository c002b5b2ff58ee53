"""A highly available Ray cluster on this machine, laid out as on Kubernetes: every node a host of
its own (edgectl.netns: own namespace, own IP), the GCS's state in a Redis of our own (GCS fault
tolerance, as KubeRay's gcsFaultToleranceOptions), the ingress on every node and the router's
replicas on different nodes. Used by the high-availability tests; each part can be killed as a
real crash would kill it.

"The ingress on a node" is whatever listens on the serve port at that node's address: Serve's
proxy today, the router replica itself where direct ingress serves. It is found by its socket,
not by an actor's name, so killing it means the same thing in both."""

from __future__ import annotations

import contextlib
import copy
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from deployments.k8s.high_availability import serve_on_every_node
from edgectl.local_cluster import LocalCluster, RayNode, wait_until
from edgectl.local_services import RedisServer
from edgectl.netns import HostNetwork
from edgectl.small_config import regional_config

SERVE_PORT = 8000  # every node's own address: the same port everywhere, as in pods
TCP_LISTEN = "0A"  # the state column of /proc/net/tcp

# The layout: the head carries region eu; each worker a region and the ingress resource, which
# the router and edge-control need, so that they live where the head's death does not reach.
INGRESS_RESOURCE = "ingress"
HEAD_RESOURCES = {"region:eu": 100}
WORKERS = {
    "us": {"region:us": 100, INGRESS_RESOURCE: 100},
    "ap": {"region:ap": 100, INGRESS_RESOURCE: 100},
}
# Embeddings everywhere; moderation and chat warm in us (the other regions wake from zero on
# failover): every replica more is a minute more of start on a loaded 2-core machine.
SERVED = {
    "embedding": {"eu": 1, "us": 1, "ap": 1},
    "moderation": {"eu": 0, "us": 1, "ap": 0},
    "glm": {"eu": 0, "us": 1, "ap": 0},
}
HA_ENV = {
    # A killed node is declared dead after 3 missed 1 s health checks, not Ray's 5 x 3 s.
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    # A proxy on a 1-CPU node passes Serve's readiness check in seconds on a quiet machine; on
    # one shared with other tests at load 50-120 it took longer than Serve's 5 s again and again,
    # and its controller killed and restarted it in a loop.
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
}
DEPLOY_S = 600  # the first deploy: every replica and proxy a new process, one at a time a node


def every_node_ingress(serve_config: Mapping[str, Any], port: int = SERVE_PORT) -> dict[str, Any]:
    """`serve_config` with the ingress on every node (all addresses, `port`) and at most one
    router replica per node, so that losing a node loses one of them."""
    config = copy.deepcopy(dict(serve_config))
    serve_on_every_node(config)
    config["http_options"] = {**config.get("http_options", {}), "host": "0.0.0.0", "port": port}
    for app in config["applications"]:
        for deployment in app.get("deployments", []):
            if deployment["name"] == "router":
                deployment["max_replicas_per_node"] = 1
    return config


def ha_serve_config(serve_config: Path, models_root: Path) -> dict[str, Any]:
    """`serve_config` cut to SERVED in this layout, the ingress on every node, no warm pool
    (its prestarted workers would double the processes a loaded machine starts)."""
    config = every_node_ingress(
        regional_config(
            serve_config, models_root, SERVE_PORT, SERVED, ingress_resource=INGRESS_RESOURCE
        )
    )
    config["applications"][0]["args"]["warm_pool"] = {"enabled": False}
    return config


@dataclass
class HaCluster:
    network: HostNetwork
    redis: RedisServer
    ray: LocalCluster
    port: int = SERVE_PORT
    deployed: tuple[dict[str, Any], Path] | None = None  # the config last deployed, and its file

    @classmethod
    def start(
        cls,
        *,
        env: Mapping[str, str],
        head_cpus: float = 2,
        head_resources: Mapping[str, float] = HEAD_RESOURCES,
        workers: Mapping[str, Mapping[str, float]] = WORKERS,
        worker_cpus: float = 1,
    ) -> HaCluster:
        """A head and one worker node per entry of `workers` ({name: resources}); `env` for
        every node (HA_ENV's settings are added)."""
        network = HostNetwork.create()
        redis: RedisServer | None = None
        try:
            redis = RedisServer.start(host=network.gateway_ip)
            ray = LocalCluster.start(
                num_cpus=head_cpus,
                resources=head_resources,
                env={**env, **HA_ENV},
                network=network,
                gcs_redis=redis,
            )
        except BaseException:
            if redis is not None:
                redis.remove()
            network.remove()
            raise
        cluster = cls(network, redis, ray)
        try:
            for name, resources in workers.items():
                ray.add_node(name, num_cpus=worker_cpus, resources=resources)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def deploy(self, config: Mapping[str, Any], config_path: Path) -> None:
        """`serve deploy` of `config`, then until the cluster is whole."""
        config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False))
        self.ray.serve_deploy(config_path, attempts=3)  # the first deploy starts Serve
        self.deployed = (copy.deepcopy(dict(config)), config_path)
        wait_until(self.whole, DEPLOY_S, "every node's ingress", every_s=2)

    def whole(self) -> bool:
        """Every node ALIVE, the app RUNNING, every node's ingress answering; else raises what
        is missing (wait_until reports it at its deadline)."""
        summary = self.ray.dashboard_get("/nodes?view=summary")["data"]["summary"]
        alive = [n for n in summary if n.get("raylet", {}).get("state") == "ALIVE"]
        if len(alive) != len(self.ray.nodes):
            raise RuntimeError(f"{len(alive)} of {len(self.ray.nodes)} nodes alive")
        status = self.ray.serve_applications()["applications"]["edge"]["status"]
        if status != "RUNNING":
            raise RuntimeError(f"the app is {status}")
        silent = [node.name for node in self.ray.nodes if not self.ingress_answers(node)]
        if silent:
            raise RuntimeError(f"no ingress answers on {silent}")
        return True

    def ingress_answers(self, node: RayNode) -> bool:
        try:
            return httpx.get(f"{self.ingress_url(node)}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def node(self, name: str) -> RayNode:
        (node,) = [node for node in self.ray.nodes if node.name == name]
        return node

    def ingress_url(self, node: RayNode) -> str:
        return f"http://{node.ip}:{self.port}"

    def ingress_pids(self, node: RayNode) -> list[int]:
        """The node's processes listening on the serve port."""
        pids = node.pids("")
        inodes = _listening_inodes(pids, self.port)
        return [pid for pid in pids if inodes & _socket_inodes(pid)]

    def kill_ingress(self, node: RayNode) -> list[int]:
        """SIGKILL what listens on the serve port of `node`; the pids killed."""
        pids = self.ingress_pids(node)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def stop(self) -> None:
        """The cluster, then Redis, then the namespaces: nothing of ours is left."""
        try:
            self.ray.stop()
        finally:
            self.redis.remove()
            self.network.remove()


def _listening_inodes(pids: list[int], port: int) -> set[str]:
    """Inodes of sockets listening on `port` in the network namespace of `pids` (all in one)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            rows = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
            rows += Path(f"/proc/{pid}/net/tcp6").read_text().splitlines()[1:]
            found = set()
            for row in rows:
                fields = row.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                if local_port == port and fields[3] == TCP_LISTEN:
                    found.add(fields[9])
            return found
    return set()


def _socket_inodes(pid: int) -> set[str]:
    found = set()
    with contextlib.suppress(OSError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    found.add(target[len("socket:[") : -1])
    return found
