"""free_port: the ports the tests and benchmarks give their servers are ones nobody else on the
machine draws by itself (not the kernel's ephemeral range), not held now, and never the same one
twice in a process."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgectl import processes


def ephemeral_range() -> range:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return range(int(low), int(high) + 1)


@pytest.fixture
def listener() -> Iterator[int]:
    """A port held by a listening socket, inside UNCLAIMED_PORTS."""
    with socket.socket() as held:
        for port in processes.UNCLAIMED_PORTS:
            try:
                held.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        held.listen()
        yield port


def test_ports_come_from_outside_the_kernels_ephemeral_range() -> None:
    handed = {processes.free_port() for _ in range(50)}
    assert len(handed) == 50  # never twice
    assert not handed & set(ephemeral_range())
    assert not handed & set(range(10002, 20000))  # Ray's worker ports
    assert not handed & set(range(30000, 31001))  # Serve's direct-ingress replicas


def test_a_held_port_and_a_handed_out_one_are_never_handed_out(
    listener: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(processes, "_handed_out", set())
    monkeypatch.setattr(processes, "UNCLAIMED_PORTS", range(listener, listener + 2))
    assert not processes.is_unbound(listener)
    assert processes.free_port() == listener + 1
    with pytest.raises(RuntimeError, match="no free port"):
        processes.free_port()
