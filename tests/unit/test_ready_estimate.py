"""ReadyEstimator on a manual clock: the cold starts it measures, the quantile a Retry-After is
planned on, a wake in flight counted down, and a pool up once its wake answered."""

from __future__ import annotations

import pytest

from deployments.ingress.edge.clock import ManualEdgeClock
from deployments.ingress.edge.ready_estimate import (
    OVERDUE_RETRY_S,
    SAMPLE_WINDOW,
    WOKEN_WARM_S,
    ReadyEstimator,
)

SHARED_MEAN_S = 2.0  # edge-control's mean cold start of the model


def cold_start(estimator: ReadyEstimator, clock: ManualEdgeClock, seconds: float) -> None:
    """A wake sent now whose replica comes up `seconds` later."""
    estimator.wake_sent("m", "ap")
    clock.advance(seconds)
    estimator.wake_answered("m", "ap", replica_ready_at=clock.unix())


def test_before_five_cold_starts_the_estimate_is_the_shared_mean_with_a_margin() -> None:
    clock = ManualEdgeClock()
    estimator = ReadyEstimator(clock)
    assert estimator.cold_start_s("m", SHARED_MEAN_S) == pytest.approx(2.5)
    cold_start(estimator, clock, 4.0)  # slower than the mean says: the slowest one rules
    assert estimator.cold_start_s("m", SHARED_MEAN_S) == pytest.approx(4.0)
    assert estimator.cold_start_s("other", SHARED_MEAN_S) == pytest.approx(2.5)  # per model


def test_a_cold_start_measured_here_beats_a_shared_figure_that_is_only_the_default() -> None:
    clock = ManualEdgeClock()
    estimator = ReadyEstimator(clock)
    # nothing measured anywhere: the configured default, with the margin
    assert estimator.cold_start_s("m", SHARED_MEAN_S, shared_measured=False) == pytest.approx(2.5)
    cold_start(estimator, clock, 0.2)  # a wake answered by a replica on a warm pool worker
    assert estimator.cold_start_s("m", SHARED_MEAN_S, shared_measured=False) == pytest.approx(0.25)
    # a measured shared mean still holds until five are measured here
    assert estimator.cold_start_s("m", SHARED_MEAN_S) == pytest.approx(2.5)


def test_the_estimate_is_the_ninetieth_percentile_of_the_recent_cold_starts() -> None:
    clock = ManualEdgeClock()
    estimator = ReadyEstimator(clock)
    for seconds in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0):
        cold_start(estimator, clock, seconds)
    # 9 of the 10 took 9 s or less: a retry planned on 9 s succeeds 9 times in 10 (the mean,
    # 5.5 s, half the time)
    assert estimator.cold_start_s("m", SHARED_MEAN_S) == pytest.approx(9.0)
    for _ in range(SAMPLE_WINDOW):  # the model got faster: old starts leave the window
        cold_start(estimator, clock, 1.5)
    assert estimator.cold_start_s("m", SHARED_MEAN_S) == pytest.approx(1.5)


def test_a_wake_answered_by_a_replica_up_before_it_was_sent_measures_nothing() -> None:
    clock = ManualEdgeClock()
    estimator = ReadyEstimator(clock)
    estimator.wake_sent("m", "ap")
    clock.advance(0.01)
    estimator.wake_answered("m", "ap", replica_ready_at=clock.unix() - 60.0)
    assert estimator.up("m", "ap")  # but the pool is up
    assert estimator.cold_start_s("m", SHARED_MEAN_S) == pytest.approx(2.5)


def test_a_wake_in_flight_counts_down_and_an_overdue_one_retries_soon() -> None:
    clock = ManualEdgeClock()
    estimator = ReadyEstimator(clock)
    assert estimator.ready_in_s("m", "ap", SHARED_MEAN_S) == pytest.approx(2.5)  # none sent
    estimator.wake_sent("m", "ap")
    assert estimator.waking("m", "ap") and not estimator.waking("m", "eu")
    clock.advance(1.0)
    assert estimator.ready_in_s("m", "ap", SHARED_MEAN_S) == pytest.approx(1.5)
    assert estimator.ready_in_s("m", "eu", SHARED_MEAN_S) == pytest.approx(2.5)  # per region
    clock.advance(5.0)  # slower than ever measured: not 0 ("now"), a retry soon
    assert estimator.ready_in_s("m", "ap", SHARED_MEAN_S) == OVERDUE_RETRY_S


def test_a_pool_is_up_from_its_wakes_answer_until_the_snapshot_has_caught_up() -> None:
    clock = ManualEdgeClock()
    estimator = ReadyEstimator(clock)
    cold_start(estimator, clock, 3.0)
    assert estimator.up("m", "ap") and not estimator.waking("m", "ap")
    assert estimator.ready_in_s("m", "ap", SHARED_MEAN_S) == 0.0
    clock.advance(WOKEN_WARM_S)
    assert not estimator.up("m", "ap")  # the snapshot speaks for the pool again


def test_a_failed_wake_measures_nothing_and_leaves_the_pool_cold() -> None:
    clock = ManualEdgeClock()
    estimator = ReadyEstimator(clock)
    estimator.wake_sent("m", "ap")
    clock.advance(120.0)
    estimator.wake_failed("m", "ap")
    assert not estimator.waking("m", "ap") and not estimator.up("m", "ap")
    assert estimator.ready_in_s("m", "ap", SHARED_MEAN_S) == pytest.approx(2.5)
