"""Local processes the CLI, tests and benchmarks start: a free port to give one, and waiting for
one to come up with a deadline. Shared by the local Ray cluster and the local Redis/PostgreSQL
servers."""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Callable
from typing import Any

# Where the ports we hand out come from: a kernel-chosen port (bind to port 0) is drawn from the
# ephemeral range (32768+), which every outgoing connection and every port-0 listener of Ray's
# processes also draws from, so in the seconds between choosing a port and our server binding it
# someone else can take it (CI saw HAProxy's stats listener fail "Address already in use"). This
# range is where nothing on a Ray machine takes a port by itself: above Ray's worker ports
# (10002-19999), below Serve's direct-ingress replicas (30000+) and the ephemeral range.
UNCLAIMED_PORTS = range(20000, 30000)
_handed_out: set[int] = set()  # never hand this process the same port twice


def free_port() -> int:
    """A port nobody holds right now, from UNCLAIMED_PORTS, not handed out before here."""
    for _ in range(500):
        port = random.choice(UNCLAIMED_PORTS)
        if port not in _handed_out and is_unbound(port):
            _handed_out.add(port)
            return port
    raise RuntimeError(f"no free port in {UNCLAIMED_PORTS} after 500 tries")


def is_unbound(port: int) -> bool:
    """No socket of any address holds `port` (a wildcard bind fails on any of them)."""
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
        return True


def wait_until(check: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.5) -> Any:
    """Poll until `check()` returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            result = check()
            if result:
                return result
        except Exception as exc:  # noqa: BLE001 - keep polling; reported at the deadline
            last_error = exc
        time.sleep(every_s)
    raise TimeoutError(
        f"timed out after {timeout_s}s waiting for {what} (last error: {last_error})"
    )
