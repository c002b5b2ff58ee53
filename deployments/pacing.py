"""How often a poller asks again: fast while something happens, slower while all is still (an idle
platform should cost next to no CPU)."""

from __future__ import annotations


class PollPacer:
    """The wait before the next poll: `fast_s` after a poll where something happened, twice the
    last wait after one where nothing did, up to `idle_s`."""

    def __init__(self, fast_s: float, idle_s: float) -> None:
        if not 0 < fast_s <= idle_s:
            raise ValueError(f"poll intervals need 0 < fast_s <= idle_s, got {fast_s}, {idle_s}")
        self.fast_s, self.idle_s = fast_s, idle_s
        self.interval_s = fast_s

    def after_read(self, busy: bool) -> float:
        self.interval_s = self.fast_s if busy else min(self.idle_s, self.interval_s * 2)
        return self.interval_s

    @property
    def idle(self) -> bool:
        return self.interval_s > self.fast_s
