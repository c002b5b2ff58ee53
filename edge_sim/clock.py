"""Time as an injected callable, so state machines are tested without sleeping."""

from __future__ import annotations

from collections.abc import Callable

Clock = Callable[[], float]
"""Returns seconds on a monotonic scale (time.monotonic in production)."""


class ManualClock:
    """A clock that moves only when told to: for tests and replayed drills."""

    def __init__(self, start_s: float = 0.0):
        self._now = start_s

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        self._now += seconds
