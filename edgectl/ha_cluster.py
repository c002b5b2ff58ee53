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

from deployments.k8s.high_availability import serve_on_every_node
from edgectl.local_cluster import LocalCluster, RayNode
from edgectl.local_services import RedisServer
from edgectl.netns import HostNetwork

SERVE_PORT = 8000  # every node's own address: the same port everywhere, as in pods
TCP_LISTEN = "0A"  # the state column of /proc/net/tcp


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


@dataclass
class HaCluster:
    network: HostNetwork
    redis: RedisServer
    ray: LocalCluster
    port: int = SERVE_PORT

    @classmethod
    def start(
        cls,
        *,
        head_cpus: float,
        head_resources: Mapping[str, float],
        workers: Mapping[str, Mapping[str, float]],
        worker_cpus: float,
        env: Mapping[str, str],
    ) -> HaCluster:
        """A head and one worker node per entry of `workers` ({name: resources})."""
        network = HostNetwork.create()
        redis: RedisServer | None = None
        try:
            redis = RedisServer.start(host=network.gateway_ip)
            ray = LocalCluster.start(
                num_cpus=head_cpus,
                resources=head_resources,
                env=env,
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
