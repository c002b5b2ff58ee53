"""Local processes the CLI, tests and benchmarks start: a free port to give one, and waiting for
one to come up with a deadline. Shared by the local Ray cluster and the local Redis/PostgreSQL
servers."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any


def free_port() -> int:
    """A port nobody listens on right now (the kernel's choice)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


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
