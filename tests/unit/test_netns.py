"""Hosts of our own without Ray: namespaces on a bridge with their own IPs, a server in one reached
from another and from here, nothing routed outside, nothing left behind; the ingress of a node
found by its listening socket; the serve config laid out for every node."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest
import yaml

from edgectl.ha_cluster import _listening_inodes, _socket_inodes, every_node_ingress
from edgectl.local_cluster import wait_until
from edgectl.netns import HostNetwork, NetworkUnavailable, check_available

REPO = Path(__file__).resolve().parents[2]
CONNECT = (
    "import socket, sys; s = socket.socket(); s.settimeout(5); "
    "print(s.connect_ex((sys.argv[1], int(sys.argv[2]))))"
)


@pytest.fixture
def network(unavailable: Callable[[str], NoReturn]) -> Iterator[HostNetwork]:
    try:
        check_available()
    except NetworkUnavailable as absent:
        unavailable(str(absent))
    hosts = HostNetwork.create()
    try:
        yield hosts
    finally:
        hosts.remove()
        assert hosts.leftovers() == []


def connect(argv_prefix: list[str], ip: str, port: int) -> int:
    done = subprocess.run(
        [*argv_prefix, sys.executable, "-c", CONNECT, ip, str(port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return int(done.stdout.strip())


def test_hosts_reach_each_other_and_this_process_but_nothing_outside(network: HostNetwork):
    head, worker = network.add_host("head"), network.add_host("worker")
    assert network.add_host("head") == head  # the same host (and IP) when asked again
    assert len({head.ip, worker.ip, network.gateway_ip}) == 3
    port = 8000  # the same port on both hosts: each has its own
    servers = [
        subprocess.Popen(
            host.command([sys.executable, "-m", "http.server", str(port), "--bind", host.ip]),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for host in (head, worker)
    ]
    try:
        wait_until(lambda: connect([], worker.ip, port) == 0, 60, "the worker's server")
        wait_until(lambda: connect([], head.ip, port) == 0, 60, "the head's server")
        assert connect(head.command([]), worker.ip, port) == 0
        # No route out of our namespaces (a documentation address: any outside one is alike).
        assert connect(head.command([]), "192.0.2.1", 80) != 0
    finally:
        for server in servers:
            server.kill()
            server.wait()


def test_the_ingress_is_found_by_its_listening_socket() -> None:
    with socket.socket() as listener, socket.socket() as other:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        other.bind(("127.0.0.1", 0))  # bound, not listening
        port, other_port = listener.getsockname()[1], other.getsockname()[1]
        inodes = _listening_inodes([os.getpid()], port)
        assert inodes and inodes <= _socket_inodes(os.getpid())
        assert not _listening_inodes([os.getpid()], other_port)


def test_the_serve_config_puts_the_ingress_on_every_node_and_routers_apart() -> None:
    shipped = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    config = every_node_ingress(shipped, port=8123)
    assert config["proxy_location"] == "EveryNode"
    assert config["http_options"] == {**shipped["http_options"], "host": "0.0.0.0", "port": 8123}
    (router,) = [d for d in config["applications"][0]["deployments"] if d["name"] == "router"]
    assert router["max_replicas_per_node"] == 1 and router["num_replicas"] >= 2
    assert shipped["proxy_location"] == "HeadOnly"  # the shipped file is left as it was
