"""Virtual time for asyncio code under test: an event loop whose clock stands still while any task
can run and, once every task waits on a timer, jumps to the earliest one (trio's MockClock with
`autojump_threshold=0`). The sleeps, `asyncio.timeout`s and `asyncio.wait(timeout=)`s of the code
under test then pass at once, in the order real time would give them, and a test reads exact
times off the clock (tests/unit/test_no_sleeps.py: no unit test waits on the wall clock)."""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTime:
    """The time of the event loops it makes; a Clock (`time_now = virtual()`) for the code under
    test, so its readings and the loop's timers agree."""

    def __init__(self, start_s: float = 0.0):
        self.now = start_s

    def __call__(self) -> float:
        return self.now

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return _VirtualTimeLoop(self)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """asyncio.run on a loop of this time."""
        with asyncio.Runner(loop_factory=self.new_event_loop) as runner:
            return runner.run(main)

    @contextmanager
    def installed(self) -> Iterator[VirtualTime]:
        """Every event loop made meanwhile keeps this time: asyncio.run's inside the code under
        test too."""
        previous = asyncio.get_event_loop_policy()
        asyncio.set_event_loop_policy(_Policy(self))
        try:
            yield self
        finally:
            asyncio.set_event_loop_policy(previous)

    async def sleep(self, seconds: float) -> None:
        """A Sleep for fakes (a slow server): a timer on the running loop, which must keep this
        time, so that it never waits on the wall clock."""
        loop = asyncio.get_running_loop()
        if not (isinstance(loop, _VirtualTimeLoop) and loop.virtual is self):
            raise RuntimeError("VirtualTime.sleep on an event loop that keeps real time")
        woken: asyncio.Future[None] = loop.create_future()
        timer = loop.call_later(seconds, _wake, woken)
        try:
            await woken
        finally:
            timer.cancel()


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():  # not cancelled meanwhile
        woken.set_result(None)


class _JumpingSelector(selectors.DefaultSelector):
    """Asked to wait `timeout` seconds for I/O (the loop's next timer is that far away): looks
    without waiting and, when nothing is ready, moves the time on instead."""

    def __init__(self, virtual: VirtualTime):
        super().__init__()
        self._virtual = virtual

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout <= 0:
            # No timer at all: what the loop waits for is another thread (its self-pipe).
            return super().select(timeout)
        ready = super().select(0)
        if not ready:
            self._virtual.now += timeout
        return ready


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, virtual: VirtualTime):
        self.virtual = virtual
        super().__init__(_JumpingSelector(virtual))

    def time(self) -> float:
        return self.virtual.now


class _Policy(asyncio.DefaultEventLoopPolicy):
    def __init__(self, virtual: VirtualTime):
        super().__init__()
        self._virtual = virtual

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return self._virtual.new_event_loop()
