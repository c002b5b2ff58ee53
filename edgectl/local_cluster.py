"""A Ray cluster on this machine that we start and alone stop: its own temp dir, free ports, and
each node's processes in a process group of their own, so stopping it (or killing one node, a
real node failure) never touches another Ray on the same machine. Used by the integration tests
and the benchmarks; driven with the CLI docs/operating.md gives operators (`ray start`, `serve`)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from edgectl.boot_priority import BOOT_NICE, favour_process, set_session_nice
from edgectl.processes import free_port
from edgectl.processes import wait_until as wait_until  # importers read it here
from edgectl.ray_node import RayNode

if TYPE_CHECKING:
    from edgectl.local_services import RedisServer
    from edgectl.netns import HostNetwork

BIN = Path(sys.executable).parent
START_TIMEOUT_S = 120
STOP_GRACE_S = 10
NODE_START_ATTEMPTS = 4
STARTED_LINE = "Ray runtime started"  # what `ray start` prints once every process of the node is up
# With GCS fault tolerance a worker node's raylet waits this long for a restarted GCS before it
# exits (Ray's default is 60 s): KubeRay's value for worker pods when GCS FT is on.
GCS_RECONNECT_TIMEOUT_S = 600
DASHBOARD_AGENT = "dashboard/agent.py"  # in its command line; the raylet waits on its ports
HEAD = "head"  # the head node's name (and its host's, with a network)


class NodeStartFailed(RuntimeError):
    """`ray start` for a node exited, or the node did not come up in time."""


def own_haproxy_ports() -> dict[str, str]:
    """Free ports for the stats and metrics listeners of the HAProxy a Serve of this cluster
    starts (serve_config.yaml's front): HAProxy binds with SO_REUSEPORT, so two clusters on Ray's
    fixed defaults (8404, 9101) would share them silently, each answering for the other."""
    return {
        "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
    }


@dataclass
class LocalCluster:
    """Start with `LocalCluster.start(...)`; always `stop()` (or use `running(...)`)."""

    root: Path
    gcs_port: int
    dashboard_port: int
    metrics_port: int
    env: dict[str, str]
    token_path: Path
    nodes: list[RayNode] = field(default_factory=list)
    # Each node in a network namespace of its own (edgectl.netns), when given.
    network: HostNetwork | None = None
    # A temp dir made for this cluster (its token, Ray's session and logs): removed by `stop`.
    owns_root: bool = False
    # GCS fault tolerance: the GCS keeps its state in this Redis, so the head may be restarted.
    gcs_redis: RedisServer | None = None

    @property
    def host_ip(self) -> str:
        """The head's address: where the GCS and the dashboard listen."""
        return self.network.hosts[HEAD].ip if self.network else "127.0.0.1"

    @property
    def head(self) -> RayNode:
        (head,) = [node for node in self.nodes if node.is_head]
        return head

    @property
    def gcs_address(self) -> str:
        return f"{self.host_ip}:{self.gcs_port}"

    @property
    def session_dir(self) -> Path:
        """The head's Ray session directory (its logs, the Serve controller's among them)."""
        return self.root / "ray" / "session_latest"

    @property
    def dashboard_url(self) -> str:
        return f"http://{self.host_ip}:{self.dashboard_port}"

    def dashboard_get(self, path: str) -> Any:
        """GET the dashboard's REST API (token auth on, as on an operator's cluster)."""
        reply = httpx.get(
            f"{self.dashboard_url}{path}",
            headers={"authorization": f"Bearer {self.token_path.read_text().strip()}"},
            timeout=10,
        )
        reply.raise_for_status()
        return reply.json()

    @classmethod
    def start(
        cls,
        *,
        num_cpus: float = 4,
        resources: Mapping[str, float] | None = None,
        env: Mapping[str, str] | None = None,
        root: Path | None = None,
        network: HostNetwork | None = None,
        gcs_redis: RedisServer | None = None,
    ) -> LocalCluster:
        """A head node with the dashboard (Serve's REST API) and a Prometheus metrics port. With
        `network`, every node runs in a namespace of its own (the head's is "head"); with
        `gcs_redis`, the GCS keeps its state there, as KubeRay's GCS fault tolerance does."""
        owns_root = root is None
        root = root or Path(tempfile.mkdtemp(prefix="edge-ray-"))
        gcs_port, dashboard_port, metrics_port = free_port(), free_port(), free_port()
        # A token of our own (never ~/.ray's): the cluster is as locked as an operator's.
        token_path = root / "auth_token"
        token_path.write_text(secrets.token_hex(32))
        token_path.chmod(0o600)
        if network is not None:
            network.add_host(HEAD)
        cluster = cls(
            root,
            gcs_port,
            dashboard_port,
            metrics_port,
            {},
            token_path,
            network=network,
            gcs_redis=gcs_redis,
            owns_root=owns_root,
        )
        cluster.env = {
            **os.environ,
            **own_haproxy_ports(),
            **(env or {}),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_path),
            "RAY_ADDRESS": cluster.gcs_address,
            "RAY_DASHBOARD_ADDRESS": cluster.dashboard_url,
        }
        if gcs_redis is not None:
            cluster.env["RAY_gcs_rpc_server_reconnect_timeout_s"] = str(GCS_RECONNECT_TIMEOUT_S)
        try:
            cluster._start_head(num_cpus, resources or {})
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _start_head(self, num_cpus: float, resources: Mapping[str, float]) -> RayNode:
        """The head on its fixed ports (a restarted head is found where the nodes look)."""
        args = [
            "--head",
            "--port",
            str(self.gcs_port),
            "--dashboard-host",
            self.host_ip,
            "--dashboard-port",
            str(self.dashboard_port),
            "--metrics-export-port",
            str(self.metrics_port),
            "--ray-client-server-port",
            str(free_port()),
            "--temp-dir",
            str(self.root / "ray"),
        ]
        env = {}
        if self.gcs_redis is not None:
            # What KubeRay sets on a head pod with gcsFaultToleranceOptions; the namespace keeps
            # this cluster's keys apart from any other's in the same Redis.
            args += ["--redis-password", self.gcs_redis.password]
            env = {
                "RAY_REDIS_ADDRESS": self.gcs_redis.address,
                "RAY_external_storage_namespace": self.root.name,
            }
        return self._start_until_up(HEAD, num_cpus, resources, args, env)

    def add_node(self, name: str, *, num_cpus: float, resources: Mapping[str, float]) -> RayNode:
        """A worker node joining the head: its own raylet, its own process group. Returns once
        `ray start` says the node is up, not when the GCS first lists it: a raylet aborts when
        its dashboard agent has not written its ports within about 15 s (a fixed wait in Ray's
        raylet). The node boots with a raised CPU share (edgectl.boot_priority) so that a
        machine busy with other nodes and load does not starve its agent past that wait; a
        start that dies all the same is retried, and every failed one is reported."""
        return self._start_until_up(name, num_cpus, resources, ["--address", self.gcs_address])

    def _start_until_up(
        self,
        name: str,
        num_cpus: float,
        resources: Mapping[str, float],
        args: list[str],
        env: Mapping[str, str] | None = None,
    ) -> RayNode:
        failures: list[str] = []
        for _ in range(NODE_START_ATTEMPTS):
            node = self._start_node(name, num_cpus, resources, args, env)
            try:
                self._wait_node_up(node)
                set_session_nice(node.process.pid, 0)
                return node
            except NodeStartFailed as failure:
                failures.append(str(failure))
                self._discard(node)
        raise NodeStartFailed(
            f"node {name} did not start in {NODE_START_ATTEMPTS} attempts:\n" + "\n".join(failures)
        )

    def kill_node(self, node: RayNode) -> None:
        """A real node failure: every process of that node dies at once, no goodbye."""
        node.signal_group(signal.SIGKILL)
        node.process.wait(timeout=STOP_GRACE_S)

    def restart_node(self, node: RayNode) -> RayNode:
        """The same node (name, CPUs, resources, host) started again; the head too, on its own
        ports, which needs GCS fault tolerance for the cluster to survive it."""
        self.nodes.remove(node)
        if node.is_head:
            # `ray start --head` refuses a port that its temp dir's address file names while a
            # process on this machine has that GCS address in its command line: on one machine
            # the other nodes' daemons do. On hosts of their own they would not; the dead
            # head's file goes.
            (self.root / "ray" / "ray_current_cluster").unlink(missing_ok=True)
            return self._start_head(node.num_cpus, node.resources)
        return self.add_node(node.name, num_cpus=node.num_cpus, resources=node.resources)

    def stop(self) -> None:
        """SIGTERM each node's group (worker nodes first), then SIGKILL what is left."""
        for node in reversed(self.nodes):
            node.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for node in reversed(self.nodes):
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            # Workers the raylet forked may outlive it for a moment: nothing of ours stays.
            node.signal_group(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.process.wait(timeout=5)
        self.nodes.clear()
        if self.owns_root:  # each cluster left ~13 MB of sessions and logs in /tmp
            shutil.rmtree(self.root, ignore_errors=True)

    def cli(self, *args: str, timeout_s: float = 180, check: bool = True) -> str:
        """`ray ...` / `serve ...` against this cluster, as an operator types them."""
        done = subprocess.run(
            [str(BIN / args[0]), *args[1:]],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}"
            )
        return done.stdout

    def serve_deploy(self, config_path: Path, attempts: int = 1) -> None:
        """`serve deploy config_path`, tried up to `attempts` times. The first deploy also starts
        Serve; on a starved machine its controller may kill a proxy that is slow to pass its
        health check, failing that deploy: a second one works."""
        for attempt in range(1, attempts + 1):
            try:
                self.cli("serve", "deploy", str(config_path))
                return
            except RuntimeError:
                if attempt == attempts:
                    raise
                time.sleep(5)

    def serve_applications(self) -> dict[str, Any]:
        """Serve's state from the dashboard's REST API: what `serve status` prints."""
        return dict(self.dashboard_get("/api/serve/applications/"))

    def _start_node(
        self,
        name: str,
        num_cpus: float,
        resources: Mapping[str, float],
        extra: list[str],
        env: Mapping[str, str] | None = None,
    ) -> RayNode:
        log_path = self.root / f"{name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_offset = log_path.stat().st_size if log_path.exists() else 0
        host = self.network.add_host(name) if self.network else None
        command = [
            str(BIN / "ray"),
            "start",
            "--block",
            "--disable-usage-stats",
            "--num-cpus",
            str(num_cpus),
            "--resources",
            json.dumps(dict(resources)),
            "--node-manager-port",
            str(free_port()),
            "--object-manager-port",
            str(free_port()),
            "--dashboard-agent-listen-port",
            str(free_port()),
            "--dashboard-agent-grpc-port",
            str(free_port()),
            "--runtime-env-agent-port",
            str(free_port()),
            # 0: workers bind random free ports, never a range another cluster may hold.
            "--min-worker-port",
            "0",
            "--max-worker-port",
            "0",
            *extra,
        ]
        if host is not None:
            command = host.command([*command, "--node-ip-address", host.ip])
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command,
                env={**self.env, **(env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group: ours alone to signal
            )
        # Before `ray start` forks its daemons (it imports for a second first): they inherit it.
        set_session_nice(process.pid, BOOT_NICE)
        node = RayNode(
            name, process, log_path, dict(resources), log_offset, num_cpus, list(extra), host
        )
        # The head first: it is stopped last.
        self.nodes.insert(0, node) if node.is_head else self.nodes.append(node)
        return node

    def _wait_node_up(self, node: RayNode) -> None:
        """Until `ray start` said the node is up and the GCS lists it ALIVE (through the head's
        dashboard: for the head itself, that it answers); fails at once if `ray start` exits
        (it does when any of the node's processes fails to start). Meanwhile the node's dashboard
        agent, the daemon racing Ray's fixed wait, is favoured within its session (a head boots
        a dozen Python processes at once: the dashboard's modules, the GCS, the agents)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for agent in node.pids(DASHBOARD_AGENT):
                favour_process(agent)
            if not node.alive:
                raise NodeStartFailed(
                    f"ray start for {node.name} exited ({node.process.returncode}):\n"
                    f"{node.log_since_start()[-2000:]}"
                )
            if STARTED_LINE in node.log_since_start():
                with contextlib.suppress(httpx.HTTPError):
                    if self._node_registered(node.resources):
                        return
            time.sleep(0.5)
        raise NodeStartFailed(f"node {node.name} not up after {START_TIMEOUT_S}s")

    def _discard(self, node: RayNode) -> None:
        node.signal_group(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(timeout=STOP_GRACE_S)
        if node in self.nodes:
            self.nodes.remove(node)

    def _dashboard_answers(self) -> bool:
        return bool(self.dashboard_get("/api/version"))

    def _node_registered(self, resources: Mapping[str, float]) -> bool:
        summary = self.dashboard_get("/nodes?view=summary")["data"]["summary"]
        for node in summary:
            if node.get("raylet", {}).get("state") != "ALIVE":
                continue
            total = node.get("raylet", {}).get("resourcesTotal", {})
            if all(total.get(key) == value for key, value in resources.items()):
                return True
        return False


@contextlib.contextmanager
def running(**start_args: Any) -> Iterator[LocalCluster]:
    cluster = LocalCluster.start(**start_args)
    try:
        yield cluster
    finally:
        cluster.stop()
