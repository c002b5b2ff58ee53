"""The planner's event queue on the virtual clock: (time, kind, payload), in time order and, at
one time, in the order pushed."""

from __future__ import annotations

from heapq import heappush

READY, TICK, SYNC, OUTAGE, POLICY, TIMER, DRILL = range(7)


class EventQueue(list[tuple[float, int, int, object]]):
    """A heap of (time, sequence, kind, payload); `heapq.heappop` takes the next."""

    def __init__(self) -> None:
        super().__init__()
        self._seq = 0

    def push(self, at: float, kind: int, payload: object) -> None:
        self._seq += 1
        heappush(self, (at, self._seq, kind, payload))
