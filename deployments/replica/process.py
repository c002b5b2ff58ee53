"""Process facts for cold-start accounting; imports nothing heavy, so a bare replica can use it."""

from __future__ import annotations

import os


def process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), None where that is unknown."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            start_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            return float(uptime.read().split()[0]) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
