"""What Serve's controller costs while every model is at zero: the price of a shorter control loop
(serve_config.yaml's controller_options), on the machine that pays it."""

from __future__ import annotations

import os
import time
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu_share(pid: int, seconds: float) -> float:
    """The share of one core the process used over `seconds` (while nothing else asks it to)."""
    before, started = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)
