"""EdgeOverhead on a fake clock: the router's own time is its time less each attempt's (the
simulated RTT and the model call), and there is none for an answer that reached no model."""

from __future__ import annotations

import pytest

from deployments.observability.edge_overhead import EdgeOverhead


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def test_the_overhead_is_the_routers_time_less_every_attempt() -> None:
    clock = Clock()
    overhead = EdgeOverhead(clock)
    clock.now += 0.0005  # parsing, auth, planning
    assert overhead.ms() is None  # no model called yet: no overhead to tell
    with overhead.away():  # a first attempt that failed over
        clock.now += 1.0
    clock.now += 0.0002
    with overhead.away():
        clock.now += 2.5
    clock.now += 0.0003  # the answer's encoding
    assert overhead.ms() == pytest.approx(1.0)


def test_an_attempt_still_in_flight_is_not_the_routers_time() -> None:
    """A held stream starts its response while the edge waits on a cold replica."""
    clock = Clock()
    overhead = EdgeOverhead(clock)
    clock.now += 0.002
    with overhead.away():
        clock.now += 3.0
        assert overhead.ms() == pytest.approx(2.0)
    assert overhead.ms() == pytest.approx(2.0)


def test_a_failing_attempt_is_still_counted_away() -> None:
    clock = Clock()
    overhead = EdgeOverhead(clock)
    with pytest.raises(TimeoutError), overhead.away():
        clock.now += 5.0
        raise TimeoutError
    assert overhead.ms() == pytest.approx(0.0)
