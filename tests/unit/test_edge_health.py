"""Outlier detection state machine on a manual clock."""

from __future__ import annotations

import pytest

from edge_sim.clock import ManualClock
from edge_sim.health import OutlierDetectionConfig, OutlierDetector
from edge_sim.topology import UnknownColoError

COLOS = [f"C{chr(65 + i)}{chr(65 + i)}" for i in range(10)]  # CAA, CBB, ...
A, B, C = COLOS[:3]


def detector(clock: ManualClock, colos: list[str] = COLOS, **overrides: object) -> OutlierDetector:
    settings: dict[str, object] = {
        "consecutive_failures": 3,
        "failure_rate": 0.5,
        "window_s": 10.0,
        "min_requests": 6,
        "base_ejection_s": 30.0,
        "max_ejection_s": 75.0,
        "max_ejection_percent": 100.0,
        "ejection_decay_s": 100.0,
        **overrides,
    }
    return OutlierDetector(colos, OutlierDetectionConfig.model_validate(settings), clock)


def fail(health: OutlierDetector, colo: str, times: int) -> None:
    for _ in range(times):
        health.record(colo, False)


def recover(health: OutlierDetector, clock: ManualClock, colo: str) -> None:
    """Wait out the ejection, then let one request succeed."""
    clock.advance(health.snapshot(colo)["ejected_for_s"])
    health.record(colo, True)
    assert health.state(colo) == "healthy"


def test_consecutive_failures_eject():
    clock = ManualClock()
    health = detector(clock)
    fail(health, A, 2)
    assert health.state(A) == "healthy"
    fail(health, A, 1)
    assert health.state(A) == "ejected"


def test_a_success_resets_the_consecutive_count():
    health = detector(ManualClock(), min_requests=100)
    for _ in range(5):
        fail(health, A, 2)
        health.record(A, True)
    assert health.state(A) == "healthy"


def test_failure_rate_over_window_ejects_after_min_volume():
    clock = ManualClock()
    health = detector(clock, consecutive_failures=100)
    # Alternate: never 2 failures in a row, but 50% of the window once volume reaches 6.
    for ok in [True, False, True, False, True]:
        health.record(A, ok)
    assert health.state(A) == "healthy"  # 5 requests < min_requests
    health.record(A, False)
    assert health.state(A) == "ejected"


def test_old_requests_leave_the_window():
    clock = ManualClock()
    later = [True, False, True, True, True, False]  # 2/6 failures: healthy on its own

    control = detector(clock, consecutive_failures=100)
    fail(control, A, 3)
    for ok in later:
        control.record(A, ok)
    assert control.state(A) == "ejected"  # 5/9 failures within the window

    health = detector(clock, consecutive_failures=100)
    fail(health, B, 3)
    clock.advance(10.0)  # those three failures age out of the 10 s window
    for ok in later:
        health.record(B, ok)
    assert health.state(B) == "healthy"
    assert health.snapshot(B)["window_requests"] == 6


def test_ejection_time_grows_and_is_capped():
    clock = ManualClock()
    health = detector(clock)
    durations = []
    for _ in range(4):
        fail(health, A, 3)
        durations.append(health.snapshot(A)["ejected_for_s"])
        recover(health, clock, A)
    assert durations == [30.0, 60.0, 75.0, 75.0]  # base x n, capped at max_ejection_s


def test_ejected_until_time_passes_then_half_open():
    clock = ManualClock()
    health = detector(clock)
    fail(health, A, 3)
    clock.advance(29.9)
    assert health.state(A) == "ejected"
    clock.advance(0.1)
    assert health.state(A) == "half_open"


def test_a_success_when_half_open_recovers_and_clears_the_window():
    clock = ManualClock()
    health = detector(clock)
    fail(health, A, 3)
    clock.advance(30.0)
    health.record(A, True)
    assert health.state(A) == "healthy"
    fail(health, A, 2)
    assert health.state(A) == "healthy"  # old failures do not count again


def test_one_failure_when_half_open_re_ejects_for_longer():
    clock = ManualClock()
    health = detector(clock)
    fail(health, A, 3)
    clock.advance(30.0)
    health.record(A, False)  # one failure, not three: half-open ejects at once
    assert health.state(A) == "ejected"
    assert health.snapshot(A)["ejected_for_s"] == 60.0
    assert health.ejections(A) == 2


def test_results_while_ejected_are_ignored():
    clock = ManualClock()
    health = detector(clock)
    fail(health, A, 3)
    health.record(A, True)
    fail(health, A, 10)
    assert health.snapshot(A)["ejected_for_s"] == 30.0
    assert health.ejections(A) == 1


def test_healthy_time_forgives_past_ejections():
    clock = ManualClock()
    health = detector(clock)
    fail(health, A, 3)
    recover(health, clock, A)
    fail(health, A, 3)
    recover(health, clock, A)
    assert health.ejections(A) == 2
    clock.advance(99.0)
    assert health.ejections(A) == 2
    clock.advance(1.0)
    assert health.ejections(A) == 1
    clock.advance(250.0)
    assert health.ejections(A) == 0
    fail(health, A, 3)
    assert health.snapshot(A)["ejected_for_s"] == 30.0  # back to the base ejection time


def test_max_ejection_percent_caps_how_many_are_out():
    clock = ManualClock()
    health = detector(clock, max_ejection_percent=30.0)  # 10 colos -> at most 3 out
    for colo in COLOS:
        fail(health, colo, 3)
    states = [health.state(colo) for colo in COLOS]
    assert states.count("ejected") == 3
    assert states[:3] == ["ejected"] * 3
    # Once one recovers, the next failing colo may be ejected.
    recover(health, clock, A)
    fail(health, COLOS[3], 1)
    assert health.state(COLOS[3]) == "ejected"


def test_half_open_colos_count_towards_the_cap():
    clock = ManualClock()
    health = detector(clock, max_ejection_percent=10.0)
    fail(health, A, 3)
    clock.advance(30.0)
    assert health.state(A) == "half_open"
    fail(health, B, 3)
    assert health.state(B) == "healthy"


def test_one_ejection_is_always_allowed():
    health = detector(ManualClock(), max_ejection_percent=0.0)
    fail(health, A, 3)
    assert health.state(A) == "ejected"
    fail(health, B, 3)
    assert health.state(B) == "healthy"


def test_unknown_colo():
    health = detector(ManualClock())
    with pytest.raises(UnknownColoError):
        health.record("ZZZ", True)


def test_config_rejects_max_below_base():
    with pytest.raises(ValueError, match="max_ejection_s must be >= base_ejection_s"):
        OutlierDetectionConfig(base_ejection_s=60, max_ejection_s=30)
