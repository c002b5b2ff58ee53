"""When a refused request's retry is likely to find a replica: the one estimate behind every
Retry-After for a cold start. Per model, the cold starts this router measured (a wake sent until
it answered) and their high quantile, not their mean: a client retrying at the estimate must find
the replica up most of the time. Per (model, region), when its wake was sent and when it answered
(a replica is up from then, before edge-control's next snapshot says so)."""

from __future__ import annotations

import math
from collections import deque

from deployments.ingress.edge.clock import EdgeClock

COLD_START_QUANTILE = 0.9  # a retry at the estimate succeeds about this often
SAMPLE_WINDOW = 32  # the recent cold starts of a model the quantile is taken over
MIN_SAMPLES = 5  # fewer measured here: the shared mean (edge-control's), with a margin
SHARED_MEAN_MARGIN = 1.25  # a mean is beaten half the time; a quarter more covers most starts
OVERDUE_RETRY_S = 0.5  # a wake slower than the quantile: a retry this soon may find it up
# A pool whose wake answered counts as warm this long: edge-control reads Serve and the routers
# sync every 0.5 s while things change, so its snapshot says so within a second or two.
WOKEN_WARM_S = 5.0


class ReadyEstimator:
    """Plain Python on an injected clock (monotonic seconds); one per router replica."""

    def __init__(self, clock: EdgeClock):
        self._clock = clock
        self._samples: dict[str, deque[float]] = {}
        self._sent_at: dict[tuple[str, str], float] = {}  # wakes in flight
        self._sent_unix: dict[tuple[str, str], float] = {}  # the same, in wall-clock seconds
        self._up_at: dict[tuple[str, str], float] = {}  # wakes answered

    def wake_sent(self, model: str, region: str) -> None:
        self._sent_at[(model, region)] = self._clock.now()
        self._sent_unix[(model, region)] = self._clock.unix()
        self._up_at.pop((model, region), None)

    def wake_answered(self, model: str, region: str, replica_ready_at: float) -> None:
        """The wake's replica is up: the pool is warm from now, and if that replica became
        ready after the wake was sent (unix seconds, as replicas stamp it), a cold start was
        measured: the wake's time until it answered, what a retry would have waited."""
        sent_at = self._sent_at.pop((model, region), None)
        sent_unix = self._sent_unix.pop((model, region), None)
        now = self._clock.now()
        self._up_at[(model, region)] = now
        if sent_at is not None and sent_unix is not None and replica_ready_at > sent_unix:
            self._samples.setdefault(model, deque(maxlen=SAMPLE_WINDOW)).append(now - sent_at)

    def wake_failed(self, model: str, region: str) -> None:
        """A wake that failed or timed out measured nothing; the next refusal wakes again."""
        self._sent_at.pop((model, region), None)
        self._sent_unix.pop((model, region), None)

    def waking(self, model: str, region: str) -> bool:
        return (model, region) in self._sent_at

    def up(self, model: str, region: str) -> bool:
        """Did this pool's wake answer in the last WOKEN_WARM_S (a replica is up)?"""
        up_at = self._up_at.get((model, region))
        return up_at is not None and self._clock.now() - up_at < WOKEN_WARM_S

    def cold_start_s(self, model: str, shared_mean_s: float, shared_measured: bool = True) -> float:
        """The model's cold start as a retry should plan for it: the COLD_START_QUANTILE of those
        measured here, or with fewer than MIN_SAMPLES the shared mean with a margin (at least
        the slowest one measured). A shared figure that is only the configured default
        (`shared_measured` False: no request anywhere has waited on a cold start yet, as with
        `rejectIfBusy`) yields to what this router measured: the slowest, with the margin."""
        samples = sorted(self._samples.get(model, ()))
        if len(samples) >= MIN_SAMPLES:
            rank = math.ceil(COLD_START_QUANTILE * len(samples))  # nearest rank
            return samples[rank - 1]
        if samples and not shared_measured:
            return samples[-1] * SHARED_MEAN_MARGIN
        return max([shared_mean_s * SHARED_MEAN_MARGIN, *samples])

    def ready_in_s(
        self, model: str, region: str, shared_mean_s: float, shared_measured: bool = True
    ) -> float:
        """Until a cold pool is expected to have a replica: none once its wake answered; the
        cold start less what its wake in flight already waited (OVERDUE_RETRY_S once that is
        past); the whole cold start when nothing wakes it yet."""
        if self.up(model, region):
            return 0.0
        cold_start_s = self.cold_start_s(model, shared_mean_s, shared_measured)
        sent_at = self._sent_at.get((model, region))
        if sent_at is None:
            return cold_start_s
        return max(OVERDUE_RETRY_S, cold_start_s - (self._clock.now() - sent_at))
