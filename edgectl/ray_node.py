"""One node of a local Ray cluster: its `ray start --block` process, the leader of its node's
process group and session, and how to find and signal every process of it."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from edgectl.netns import Host


@dataclass
class RayNode:
    """One `ray start --block` process: the leader of its node's process group."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    resources: Mapping[str, float]
    log_offset: int = 0  # where this start's lines begin in a log a restart appends to
    num_cpus: float = 1
    start_args: list[str] = field(default_factory=list)  # what `ray start` got besides the common
    host: Host | None = None  # its network namespace, when the cluster has hosts of its own

    @property
    def is_head(self) -> bool:
        return "--head" in self.start_args

    @property
    def ip(self) -> str:
        return self.host.ip if self.host else "127.0.0.1"

    def log_since_start(self) -> str:
        with self.log_path.open("rb") as log:
            log.seek(self.log_offset)
            return log.read().decode(errors="replace")

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal_group(self, signum: int) -> None:
        """Every process of the node: its `ray start` group and its session, which also holds
        the workers Ray 2.60's raylet puts in process groups of their own. The session is read
        before any is signalled, so the node's processes go at once, not a scan of /proc apart
        (a replica outliving its raylet by that much still answers); a second look catches a
        process forked meanwhile."""
        found = self.pids("")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)
        _signal_each(found, signum)
        _signal_each([pid for pid in self.pids("") if pid not in found], signum)

    def pids(self, command_part: str) -> list[int]:
        """This node's processes (its `ray start` session) whose command line has
        `command_part`: one daemon to kill (the GCS, say) as a real crash would."""
        return session_pids(self.process.pid, command_part)


def session_pids(session: int, command_part: str = "") -> list[int]:
    """The processes of session `session` whose command line has `command_part`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            stat = (entry / "stat").read_text()
            in_session = int(stat[stat.rindex(")") + 2 :].split()[3]) == session
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if in_session and command_part in command:
                found.append(int(entry.name))
    return found


def _signal_each(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
