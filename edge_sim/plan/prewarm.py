"""Predictive pre-warming: wake a region's model ahead of the traffic its own history expects.

The forecaster, per (model, region), from the requests whose entry colo belongs to the region
(its demand, wherever they were served), counted in buckets of `bucket_s`:
- same time yesterday: the busiest bucket of the coming `lookahead_s`, one day earlier (a daily
  pattern repeats: the morning that woke the region yesterday wakes it again today);
- recent: an EWMA of the last buckets' rates (traffic that is here now, whatever yesterday did).
The forecast is the larger of the two; the pool is held at one replica while the forecast
expects at least `min_expected` requests within `lookahead_s` (which must cover a cold start
plus a margin, so the replica is up before the first of them), and left to Serve's own
scale-to-zero otherwise. Pure and clock-free: the caller passes time and counts, so the planner
and a live controller drive the same object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

DAY_S = 86_400.0
Key = tuple[str, str]  # (model, region)


class PrewarmConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    bucket_s: float = Field(default=60.0, gt=0, description="demand is counted per bucket")
    lookahead_s: float = Field(
        default=600.0, gt=0, description="how far ahead the forecast looks (> cold start + margin)"
    )
    ewma_alpha: float = Field(
        default=0.3, gt=0, le=1, description="weight of the latest bucket in the recent rate"
    )
    min_expected: float = Field(
        default=1.0, gt=0, description="requests expected within lookahead_s to hold a replica"
    )
    period_s: float = Field(default=DAY_S, gt=0, description="the pattern's period (a day)")
    replicas: int = Field(default=1, ge=1, description="the floor while warm")

    @model_validator(mode="after")
    def _lookahead_in_period(self) -> PrewarmConfig:
        if self.lookahead_s >= self.period_s:
            raise ValueError("lookahead_s must be shorter than period_s")
        return self


class RateForecaster:
    """Requests per second expected soon, per key, from counts fed bucket by bucket."""

    def __init__(self, config: PrewarmConfig, keys: Iterable[Key]):
        self.config = config
        self._per_period = round(config.period_s / config.bucket_s)
        self._ahead = max(1, round(config.lookahead_s / config.bucket_s))
        self._keys = list(keys)
        self._index = {key: i for i, key in enumerate(self._keys)}
        self._history = np.zeros((len(self._keys), self._per_period), dtype=np.float64)
        self._seen = np.zeros(self._per_period, dtype=bool)  # buckets with a day of history
        self._ewma = np.zeros(len(self._keys))

    @property
    def keys(self) -> list[Key]:
        return list(self._keys)

    def observe(self, bucket: int, counts: Mapping[Key, int]) -> None:
        """The requests of bucket number `bucket` (time // bucket_s); keys not named had none."""
        row = np.zeros(len(self._keys))
        for key, count in counts.items():
            position = self._index.get(key)
            if position is not None:
                row[position] = count
        rate = row / self.config.bucket_s
        alpha = self.config.ewma_alpha
        self._ewma = alpha * rate + (1 - alpha) * self._ewma
        slot = bucket % self._per_period
        self._history[:, slot] = rate
        self._seen[slot] = True

    def forecast_rps(self, next_bucket: int) -> np.ndarray:
        """Per key (in `keys` order): the rate expected over the buckets from `next_bucket` on
        for lookahead_s: max(same buckets one period ago, recent EWMA)."""
        slots = (next_bucket + np.arange(self._ahead)) % self._per_period
        yesterday = np.where(self._seen[slots], self._history[:, slots], 0.0).max(axis=1)
        return np.maximum(yesterday, self._ewma)


class PredictivePrewarm:
    """A floor policy (edge_sim.plan.simulator.FloorPolicy): called every bucket_s with the
    bucket's demand, it answers the replicas each (model, region) should hold at least."""

    def __init__(self, config: PrewarmConfig, keys: Iterable[Key]):
        self.config = config
        self.interval_s = config.bucket_s
        self.forecaster = RateForecaster(config, keys)

    def floors(self, now_s: float, demand: Mapping[Key, int]) -> dict[Key, int]:
        bucket = round(now_s / self.config.bucket_s)
        if bucket > 0:
            self.forecaster.observe(bucket - 1, demand)  # the bucket that just ended
        expected = self.forecaster.forecast_rps(bucket) * self.config.lookahead_s
        warm = expected >= self.config.min_expected
        return {
            key: self.config.replicas
            for key, hold in zip(self.forecaster.keys, warm.tolist(), strict=True)
            if hold
        }
