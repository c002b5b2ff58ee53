"""A starting Ray node's share of a CPU it shares with other nodes: raised while the node boots,
back to normal once it is up, so its daemons start as fast as on a host of their own.

Why: a raylet aborts when its dashboard agent has not written its ports within a fixed ~15 s,
and the agent needs only ~1.5 s of CPU for that. On one machine that runs several nodes, the
test's own load and other tenants, Linux's autogroup scheduler gives each session (each node's
`ray start` runs in one) an equal share: measured on 2 cores at load 14-18, a booting node got
0.1-0.25 of a core, split between `ray start`, the agent, the runtime-env agent and the log
monitor, and its agent missed the wait. A restart is no different from a first start under the
same load. Per-process `nice` cannot help under autogroup (it orders processes within their
session only); the session's own weight can (`/proc/<pid>/autogroup`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

BOOT_NICE = -10  # about 9x the CPU weight of a session at the default 0
AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")


def autogroup_enabled() -> bool:
    with contextlib.suppress(OSError):
        return AUTOGROUP_SWITCH.read_text().strip() == "1"
    return False


def set_session_nice(leader_pid: int, nice: int) -> bool:
    """The CPU weight of the session (and process group) `leader_pid` leads: its autogroup's
    nice where the kernel schedules by session, else each process of its group. False when this
    process may not (a negative nice needs CAP_SYS_NICE) or the session is gone."""
    try:
        if autogroup_enabled():
            Path(f"/proc/{leader_pid}/autogroup").write_text(f"{nice}\n")
        else:
            os.setpriority(os.PRIO_PGRP, leader_pid, nice)
    except (PermissionError, ProcessLookupError, FileNotFoundError):
        return False
    return True


def session_nice(leader_pid: int) -> int:
    """What `set_session_nice` set: the autogroup's nice, else the leader's own."""
    if autogroup_enabled():
        # "/autogroup-85 nice 0"
        return int(Path(f"/proc/{leader_pid}/autogroup").read_text().split()[-1])
    return os.getpriority(os.PRIO_PROCESS, leader_pid)


def favour_process(pid: int, nice: int = BOOT_NICE) -> bool:
    """One process ahead of the others of its session (per-process nice orders a session's
    own processes). False when this process may not, or it is gone."""
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) != nice:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
    except (PermissionError, ProcessLookupError):
        return False
    return True
