"""The front spare with real HAProxies (the binary Ray runs): first two on a port of their own, no
Ray (one "Serve's", killed, and the spare answering); then on the session's cluster
(serve_config.yaml's front: Serve's HAProxy with SO_REUSEPORT and the spare beside it), where
/readyz shows it running and Serve's HAProxy killed outright refuses no connection on the port
while Serve restarts it. How the spare follows Serve's config and restarts, on fake processes:
tests/unit/test_front_spare.py."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from conftest import ServeCluster

from benchmarks.front_door.victims import is_running, kill_one
from deployments.config.front_spare import FrontSpareConfig
from deployments.control.front_spare import SpareFront, launch_with_parent
from deployments.ray_ext.haproxy_front import haproxy_binary
from edgectl.local_cluster import free_port, wait_until

PROBE_EVERY_S = 0.02
PROBE_FOR_S = 3.0

# Serve's config as far as the spare needs it: its own admin socket and state (left out of the
# spare's copy) and a frontend that answers by itself.
SERVES_CONFIG = """global
    stats socket {folder}/admin.sock mode 666 level admin expose-fd listeners
    server-state-file {folder}/server-state
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend http_frontend
    bind 127.0.0.1:{port}
    http-request return status 200 content-type text/plain string "answered"
"""


def answer(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return conn.recv(4096)


def test_two_haproxies_share_a_port_and_the_spare_answers_when_the_other_is_gone(tmp_path: Path):
    port = free_port()
    config = tmp_path / "serve.cfg"
    config.write_text(SERVES_CONFIG.format(folder=tmp_path, port=port))
    # "Serve's" HAProxy, with SO_REUSEPORT as serve_config.yaml has Serve start it.
    serves = launch_with_parent([haproxy_binary(), "-db", "-f", str(config)], tmp_path / "s.log")
    front = SpareFront(config, tmp_path / "spare", haproxy_binary(), FrontSpareConfig())
    try:
        wait_until(lambda: answer(port), timeout_s=10, what="Serve's HAProxy", every_s=0.05)
        front.check()
        assert front.running, front.describe()
        wait_until(lambda: front_listens(port, serves.pid), 10, "the spare to listen", 0.05)
        serves.send_signal(signal.SIGKILL)
        serves.wait(timeout=5)
        opened, refused = refused_connections("127.0.0.1", port, 1.0)
        assert refused == 0 and b"answered" in answer(port), f"{refused} of {opened} refused"
    finally:
        front.stop(grace_s=2.0)
        if serves.poll() is None:
            serves.send_signal(signal.SIGKILL)
            serves.wait(timeout=5)
    assert not front.running


def front_listens(port: int, other_pid: int) -> bool:
    """Whether a process besides `other_pid` has a socket listening on `port` (by /proc)."""
    inodes = listening_inodes(port)
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        if fd.parts[2] == str(other_pid):
            continue
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def listening_inodes(port: int) -> set[str]:
    """The inodes of sockets listening on `port` (TCP over IPv4, state 0A)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            found.add(fields[9])
    return found


def cluster_pids(cluster: ServeCluster) -> list[int]:
    return [pid for node in cluster.ray.nodes for pid in node.pids("")]


def refused_connections(host: str, port: int, seconds: float) -> tuple[int, int]:
    """New TCP connections to the port every PROBE_EVERY_S for `seconds`: (opened, refused)."""
    opened = refused = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        opened += 1
        try:
            socket.create_connection((host, port), timeout=2).close()
        except ConnectionRefusedError:
            refused += 1
        time.sleep(PROBE_EVERY_S)
    return opened, refused


def front_answers(cluster: ServeCluster, times: int) -> bool:
    """`times` new connections in a row answered by a router (a restarted Serve HAProxy answers
    404 until its routes arrive)."""
    for _ in range(times):
        if httpx.get(f"{cluster.base_url}/healthz", timeout=5).status_code != 200:
            return False
    return True


def test_serves_haproxy_killed_refuses_no_connection_while_the_spare_listens(
    serve_cluster: ServeCluster,
) -> None:
    def spare_running() -> bool:
        ready = httpx.get(f"{serve_cluster.base_url}/readyz", timeout=10).json()
        return bool((ready.get("front_spare") or {}).get("running"))

    wait_until(spare_running, timeout_s=60, what="the front spare to run")
    pids = cluster_pids(serve_cluster)
    assert is_running("front-spare", pids) and is_running("haproxy", pids)
    url = urlsplit(serve_cluster.base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80

    victim = kill_one("haproxy", pids)  # SIGKILL: a crash, no goodbye
    assert victim.pid is not None, victim.title
    opened, refused = refused_connections(host, port, PROBE_FOR_S)
    assert refused == 0, f"{refused} of {opened} connections refused after {victim.title}"
    # Left as found: Serve's HAProxy back (a new process), answering with its routes.
    wait_until(
        lambda: is_running("haproxy", cluster_pids(serve_cluster)),
        timeout_s=60,
        what="Serve to restart its HAProxy",
    )
    wait_until(
        lambda: front_answers(serve_cluster, 20),
        timeout_s=60,
        what="the front to answer 20 times in a row",
    )
