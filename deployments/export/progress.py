"""Stage progress for exports of real checkpoints (minutes each: load, export, optimise or
quantise, verify): a rich bar on a terminal, nothing otherwise."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Sequence

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Stages:
    """Names the stage running now; the base class shows nothing (tests, pipes, --no-progress)."""

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        yield

    def close(self) -> None:
        pass


class RichStages(Stages):
    """One bar per export: stages done of the planned ones, the current stage and its time."""

    def __init__(self, what: str, planned: Sequence[str], console: Console | None = None):
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
        )
        self._what = what
        self._task = self._progress.add_task(what, total=len(planned))
        self._progress.start()

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        self._progress.update(self._task, description=f"{self._what}: {name}")
        started = time.perf_counter()
        yield
        self._progress.console.log(
            f"{self._what}: {name} done in {time.perf_counter() - started:.1f} s"
        )
        self._progress.advance(self._task)

    def close(self) -> None:
        self._progress.update(self._task, description=f"{self._what}: done")
        self._progress.stop()


NO_STAGES = Stages()


def stages_for(what: str, planned: Sequence[str], *, enabled: bool) -> Stages:
    """A bar when asked for and stderr is a terminal (a bar redrawn into a log is noise)."""
    return RichStages(what, planned) if enabled and sys.stderr.isatty() else Stages()
