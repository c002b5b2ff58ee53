"""The edge's time, injected: monotonic seconds for deadlines, wall-clock seconds to compare with
what replicas stamp (when they became ready), and timers for an attempt's time-out and its checks.
`SystemClock` is the real one; `ManualEdgeClock` moves only when a test advances it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class EdgeClock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def unix(self) -> float:
        """Wall-clock seconds, the scale of the replicas' timestamps."""
        ...

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        """Run `callback` on the event loop `delay_s` from now, unless cancelled."""
        ...

    async def sleep(self, delay_s: float) -> None: ...


class SystemClock:
    """time.monotonic, time.time and the running event loop's timers."""

    def now(self) -> float:
        return time.monotonic()

    def unix(self) -> float:
        return time.time()

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay_s, callback)

    async def sleep(self, delay_s: float) -> None:
        await asyncio.sleep(delay_s)


class _ManualTimer:
    def __init__(self, callback: Callable[[], None]):
        self.callback: Callable[[], None] | None = callback

    def cancel(self) -> None:
        self.callback = None


class ManualEdgeClock:
    """Stands still until `advance`, which fires the timers it passes in order, each at its own
    time (a callback may set new timers; those fire too if due). Wall time moves with it."""

    def __init__(self, start_s: float = 0.0, unix_start_s: float = 1_000_000.0):
        self._now = start_s
        self._unix_offset = unix_start_s - start_s
        self._timers: list[tuple[float, int, _ManualTimer]] = []
        self._order = itertools.count()  # timers due at once fire in the order they were set

    def now(self) -> float:
        return self._now

    def unix(self) -> float:
        return self._now + self._unix_offset

    def call_later(self, delay_s: float, callback: Callable[[], None]) -> Timer:
        timer = _ManualTimer(callback)
        heapq.heappush(self._timers, (self._now + max(0.0, delay_s), next(self._order), timer))
        return timer

    async def sleep(self, delay_s: float) -> None:
        if delay_s <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.call_later(delay_s, lambda: None if woken.done() else woken.set_result(None))
        await woken

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go back")
        until = self._now + seconds
        while self._timers and self._timers[0][0] <= until:
            due, _, timer = heapq.heappop(self._timers)
            self._now = due
            if timer.callback is not None:
                timer.callback()
        self._now = until
