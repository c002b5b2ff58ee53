"""Ray Serve's controller log read as a timeline: when the controller decided to scale a deployment
up, asked Ray for the replica and saw it start, to the millisecond. Reading the log needs no
polling of the controller, which would compete with the very loop being timed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

# "INFO 2026-11-30 06:47:43,018 controller 14851 -- Upscaling Deployment(name='glm', ..." in local
# time (the logging module's default), as written by the controller itself.
_LINE = re.compile(r"^[A-Z]+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) controller \d+ -- (.*)$")
_STARTING = re.compile(r"Starting Replica\(id='([^']+)', deployment='([^']+)', app='([^']+)'\)")


@dataclass(frozen=True)
class ScaleUp:
    """One scale-up of a deployment as the controller logged it (unix times)."""

    decided_at: float  # "Upscaling Deployment(...) from N to M replicas"
    starting_at: float | None  # "Starting Replica(...)": the actor was requested from Ray
    running_at: float | None  # "Replica(...) started successfully": it takes requests now


def _timestamp(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


class ControllerLog:
    """The controller's log under a Ray session directory (logs/serve/controller_<pid>.log)."""

    def __init__(self, session_dir: Path):
        self._serve_logs = session_dir / "logs" / "serve"

    def _lines(self) -> Iterator[tuple[float, str]]:
        # controller_build_<app>_<pid>.log are the build tasks' logs, not the controller's.
        for path in sorted(self._serve_logs.glob("controller_[0-9]*.log")):
            for line in path.read_text(errors="replace").splitlines():
                match = _LINE.match(line)
                if match:
                    yield _timestamp(match.group(1)), match.group(2)

    def controller_pid(self) -> int | None:
        """The live controller's pid, from its log's name (the newest log: a restarted
        controller writes a new one)."""
        logs = sorted(
            self._serve_logs.glob("controller_[0-9]*.log"), key=lambda p: p.stat().st_mtime
        )
        return int(logs[-1].stem.rsplit("_", 1)[1]) if logs else None

    def scale_up(self, app: str, deployment: str, after: float) -> ScaleUp | None:
        """The first scale-up of `deployment` decided at or after `after` (unix time)."""
        name = f"Deployment(name='{deployment}', app='{app}')"
        decided_at: float | None = None
        starting_at: float | None = None
        replica: str | None = None
        for at, message in self._lines():
            if decided_at is None:
                if at >= after and message.startswith(f"Upscaling {name}"):
                    decided_at = at
                continue
            started = _STARTING.match(message)
            if replica is None and started and started.group(2, 3) == (deployment, app):
                replica, starting_at = started.group(1), at
            elif replica is not None and message.startswith(
                f"Replica(id='{replica}', deployment='{deployment}', app='{app}') started"
            ):
                return ScaleUp(decided_at, starting_at, at)
        return None if decided_at is None else ScaleUp(decided_at, starting_at, None)
