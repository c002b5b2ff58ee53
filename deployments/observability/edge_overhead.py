"""The gateway's own cost in one request: its time in the router outside the model replica
(from the request's start, less each model call and the simulated RTT it sleeps), sent as
`x-edge-overhead-ms` when the response starts and recorded as a histogram."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

OVERHEAD_HEADER = "x-edge-overhead-ms"


class EdgeOverhead:
    """One request's router time outside the model. The edge marks each attempt `away` (RTT and
    model call); `ms()` is None until one was made (an answer that reached no model: a cache hit,
    a refusal)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self._clock = clock
        self._started = clock()
        self._away_s = 0.0
        self._away_since: float | None = None  # an attempt in flight (a held stream's start)
        self._reached_model = False

    @contextmanager
    def away(self) -> Iterator[None]:
        """An attempt: the simulated RTT and the model call, not the router's own time."""
        self._reached_model = True
        self._away_since = since = self._clock()
        try:
            yield
        finally:
            self._away_s += self._clock() - since
            self._away_since = None

    def ms(self) -> float | None:
        """The router's own time so far, in ms; None if no model was called."""
        if not self._reached_model:
            return None
        now = self._clock()
        away_s = self._away_s + (0.0 if self._away_since is None else now - self._away_since)
        return max(0.0, now - self._started - away_s) * 1000.0
