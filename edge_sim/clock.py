"""Time as an injected callable, so state machines are tested without sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Clock = Callable[[], float]
"""Returns seconds: time.monotonic in production (time.time where a timestamp crosses processes)."""

Sleep = Callable[[float], Awaitable[None]]
"""Waits that many seconds (asyncio.sleep in production)."""


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

    async def sleep(self, seconds: float) -> None:
        """A Sleep on this clock: the time passes at once, and other tasks get a turn."""
        self.advance(max(0.0, seconds))  # like asyncio.sleep, a negative wait is none
        await asyncio.sleep(0)
