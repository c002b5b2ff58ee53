"""Injected faults: down, slower, failing; scheduled windows; seeded failure decisions."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from edge_sim.clock import ManualClock
from edge_sim.faults import ColoFault, FaultBook, FaultEffect
from edge_sim.topology import UnknownColoError


def book(clock: ManualClock, seed: int = 0) -> FaultBook:
    return FaultBook(["AMS", "FRA", "LHR"], clock, random.Random(seed))


def test_down_fault_is_active_until_cleared():
    faults = book(ManualClock())
    faults.set("AMS", ColoFault(down=True))
    assert faults.effect("AMS") == FaultEffect(down=True, added_latency_ms=0.0, error_rate=0.0)
    assert faults.effect("FRA") is None
    assert list(faults.active_effects()) == ["AMS"]
    faults.clear("AMS")
    assert faults.effect("AMS") is None and faults.active_effects() == {}


def test_scheduled_outage_window():
    clock = ManualClock(100.0)
    faults = book(clock)
    faults.add("FRA", ColoFault(down=True, start_after_s=10, duration_s=5))
    assert faults.effect("FRA") is None
    assert len(faults.scheduled("FRA")) == 1  # still to come
    clock.advance(10.0)
    assert faults.effect("FRA") is not None
    clock.advance(4.9)
    assert faults.effect("FRA") is not None
    clock.advance(0.1)
    assert faults.effect("FRA") is None
    assert faults.scheduled("FRA") == []  # expired faults are dropped


def test_duration_without_start_runs_from_now():
    clock = ManualClock()
    faults = book(clock)
    faults.set("LHR", ColoFault(added_latency_ms=80.0, duration_s=2.0))
    assert faults.effect("LHR") == FaultEffect(False, 80.0, 0.0)
    clock.advance(2.0)
    assert faults.effect("LHR") is None


def test_faults_at_one_colo_combine_and_set_replaces():
    faults = book(ManualClock())
    faults.add("AMS", ColoFault(added_latency_ms=30.0, error_rate=0.5))
    faults.add("AMS", ColoFault(added_latency_ms=20.0, error_rate=0.5))
    effect = faults.effect("AMS")
    assert effect == FaultEffect(False, 50.0, pytest.approx(0.75))
    faults.set("AMS", ColoFault(error_rate=0.1))
    assert faults.effect("AMS") == FaultEffect(False, 0.0, 0.1)


def test_error_rate_decisions_are_seeded_and_match_the_rate():
    def decisions(seed: int) -> list[bool]:
        faults = book(ManualClock(), seed)
        faults.set("AMS", ColoFault(error_rate=0.3))
        return [faults.should_fail("AMS") for _ in range(2000)]

    first = decisions(42)
    assert first == decisions(42)
    assert first != decisions(43)
    assert sum(first) / len(first) == pytest.approx(0.3, abs=0.04)


def test_no_error_rate_never_fails_and_draws_nothing():
    rng = random.Random(1)
    faults = FaultBook(["AMS"], ManualClock(), rng)
    faults.set("AMS", ColoFault(down=True))
    state = rng.getstate()
    assert not any(faults.should_fail("AMS") for _ in range(100))
    assert rng.getstate() == state


def test_certain_failure():
    faults = book(ManualClock())
    faults.set("AMS", ColoFault(error_rate=1.0))
    assert all(faults.should_fail("AMS") for _ in range(100))


def test_clear_all_and_unknown_colo():
    faults = book(ManualClock())
    faults.set("AMS", ColoFault(down=True))
    faults.set("FRA", ColoFault(down=True))
    faults.clear_all()
    assert faults.active_effects() == {}
    with pytest.raises(UnknownColoError):
        faults.set("ZZZ", ColoFault(down=True))


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({}, "must set down, added_latency_ms or error_rate"),
        ({"error_rate": 1.2}, "less than or equal to 1"),
        ({"down": True, "duration_s": 0}, "greater than 0"),
        ({"down": True, "start_after_s": -1}, "greater than or equal to 0"),
        ({"down": True, "until": 5}, "Extra inputs"),
    ],
)
def test_fault_validation(fields, says):
    with pytest.raises(ValidationError, match=says):
        ColoFault.model_validate(fields)


def test_describe_reports_timing():
    clock = ManualClock()
    faults = book(clock)
    scheduled = faults.add("AMS", ColoFault(down=True, start_after_s=5, duration_s=10))
    assert scheduled.describe(clock()) == {
        "down": True,
        "added_latency_ms": 0.0,
        "error_rate": 0.0,
        "active": False,
        "starts_in_s": 5.0,
        "ends_in_s": 15.0,
    }
    assert faults.add("FRA", ColoFault(down=True)).describe(clock())["ends_in_s"] is None
