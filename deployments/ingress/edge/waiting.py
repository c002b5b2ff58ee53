"""How long a request may wait for capacity, and how a held stream hears that it waits: the
client's limits (`WaitLimits`: Workers AI's `rejectIfBusy`, our `x-edge-max-wait-ms` header) and
the notice the dispatcher gives when an attempt must wait for a cold replica (`ColdStartNotice`)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from deployments.errors import BadHeaderValueError

MAX_WAIT_HEADER = "x-edge-max-wait-ms"
BUSY_MESSAGE = "Capacity temporarily exceeded, please try again."  # Workers AI's own words


@dataclass(frozen=True)
class WaitLimits:
    """`reject_if_busy`: never wait in a capacity queue (no region with a free warm replica now
    is a 429); `max_wait_s`: the request's wait budget (past it, a 503 whose Retry-After is the
    expected wake-up). Neither set: the server's own deadline alone. `warm_only` (a batch item's,
    never a client's; see `BACKGROUND`): no region is woken for the request, so background work
    never starts a cold replica by itself."""

    reject_if_busy: bool = False
    max_wait_s: float | None = None
    warm_only: bool = False

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> WaitLimits:
        """The limits a request's headers set (x-edge-max-wait-ms: whole milliseconds, > 0)."""
        raw = headers.get(MAX_WAIT_HEADER)
        if raw is None:
            return cls()
        if not raw.strip().isdigit() or int(raw) <= 0:
            raise BadHeaderValueError(
                f"expected a whole number of milliseconds above 0, got {raw[:40]!r}",
                header=MAX_WAIT_HEADER,
            )
        return cls(max_wait_s=int(raw) / 1000.0)


# A batch item's limits: a free warm replica now, or a BusyError at once; nothing woken.
BACKGROUND = WaitLimits(reject_if_busy=True, warm_only=True)


class ColdStartNotice:
    """Set by the dispatcher when an attempt has to wait for a cold region's first replica, so a
    streamed answer can start at once and tell its client it is warming, not hung. While held
    (the input still being checked: a refusal must keep its 400), it is told only on release."""

    def __init__(self) -> None:
        self.region: str | None = None
        self._waiting = asyncio.Event()
        self._held = False
        self._ready_in_s: Callable[[], float] | None = None

    def waiting_on(self, region: str, ready_in_s: Callable[[], float] | None = None) -> None:
        """`ready_in_s`: the edge's estimate, asked anew each time, of when the region's replica
        is up (the one a refusal's Retry-After gives)."""
        self.region = region
        self._ready_in_s = ready_in_s
        if not self._held:
            self._waiting.set()

    def describe(self) -> str:
        """`warming region=<region> ready-in-ms=<estimate now>`: a held stream's comment text."""
        text = f"warming region={self.region}"
        if self._ready_in_s is not None:
            text += f" ready-in-ms={math.ceil(self._ready_in_s() * 1000)}"
        return text

    def hold(self) -> None:
        self._held = True

    def release(self) -> None:
        self._held = False
        if self.region is not None:
            self._waiting.set()

    async def wait(self) -> str:
        """The region, once an attempt waits on a cold one."""
        await self._waiting.wait()
        assert self.region is not None
        return self.region
