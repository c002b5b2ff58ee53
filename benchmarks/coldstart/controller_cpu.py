"""What Serve's controller costs while every model is at zero: the price of a shorter control loop
(serve_config.yaml's controller_options), on the machine that pays it."""

from __future__ import annotations

import time

from benchmarks.lib.processes import cpu_seconds


def idle_cpu_share(pid: int, seconds: float) -> float:
    """The share of one core the process used over `seconds` (while nothing else asks it to)."""
    before, started = cpu_seconds([pid]), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds([pid]) - before) / (time.monotonic() - started)
