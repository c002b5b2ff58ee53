"""A live progress bar for a run (rich): requests sent and finished, errors, the current phase."""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from edgectl.loadtest.records import RequestRecord


class ProgressView(Protocol):
    def begin(self, total_requests: int, end_s: float) -> None: ...
    def tick(self, t_s: float, phase: str, in_flight: int) -> None: ...
    def sent(self) -> None: ...
    def finished(self, record: RequestRecord) -> None: ...
    def note(self, message: str) -> None: ...
    def end(self) -> None: ...


class NoProgress:
    """Shows nothing (tests, --no-progress)."""

    def begin(self, total_requests: int, end_s: float) -> None:
        pass

    def tick(self, t_s: float, phase: str, in_flight: int) -> None:
        pass

    def sent(self) -> None:
        pass

    def finished(self, record: RequestRecord) -> None:
        pass

    def note(self, message: str) -> None:
        pass

    def end(self) -> None:
        pass


class RichProgress:
    """Two bars: requests sent (against the schedule) and requests finished, with error count."""

    def __init__(self, console: Console | None = None):
        self._progress = Progress(
            TextColumn("{task.description:<9}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
        )
        self._sent: TaskID | None = None
        self._done: TaskID | None = None
        self._errors = 0
        self._cold = 0

    def begin(self, total_requests: int, end_s: float) -> None:
        self._progress.start()
        self._sent = self._progress.add_task("sent", total=total_requests, detail="")
        self._done = self._progress.add_task("finished", total=total_requests, detail="")

    def tick(self, t_s: float, phase: str, in_flight: int) -> None:
        if self._sent is not None:
            self._progress.update(self._sent, detail=f"{phase} t={t_s:.0f}s in flight {in_flight}")

    def sent(self) -> None:
        if self._sent is not None:
            self._progress.advance(self._sent)

    def finished(self, record: RequestRecord) -> None:
        self._errors += not record.ok
        self._cold += record.cold_start
        if self._done is not None:
            self._progress.update(
                self._done, advance=1, detail=f"errors {self._errors} cold starts {self._cold}"
            )

    def note(self, message: str) -> None:
        self._progress.console.log(message)

    def end(self) -> None:
        self._progress.stop()
