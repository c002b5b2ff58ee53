"""Predictive pre-warming: wake a region's model ahead of the traffic its own history expects.

The forecaster, per (model, region), from the requests whose entry colo belongs to the region
(its demand, wherever they were served), counted in buckets of `bucket_s`:
- same time yesterday: the busiest bucket of the coming `lookahead_s`, one period earlier (a
  daily pattern repeats: the morning that woke the region yesterday wakes it again today);
- recent: an EWMA of the last buckets' rates (traffic that is here now, whatever yesterday did).
The forecast is the larger of the two; a pool is held at one replica while the forecast expects
at least `min_expected` requests within `lookahead_s` (which must cover a cold start plus a
margin, so the replica is up before the first of them), and left to Serve's own scale-to-zero
otherwise. Pure and clock-free: the caller passes time and counts, so the planner
(edge_sim.plan) and edge-control (deployments.control.prewarm) drive the same object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

DAY_S = 86_400.0
Key = tuple[str, str]  # (model, region)


class PrewarmConfig(BaseModel):
    """The `edge.prewarm` section of serve_config.yaml (off unless `enabled`), and the planner's
    `predictive` policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(default=False, description="edge-control holds pools it expects busy")
    models: list[str] | None = Field(
        default=None, min_length=1, description="models pre-warmed; None: every model"
    )
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

    @model_validator(mode="after")
    def _buckets_fit(self) -> PrewarmConfig:
        if self.lookahead_s < self.bucket_s:
            raise ValueError(
                f"lookahead_s ({self.lookahead_s:g}) must be at least bucket_s ({self.bucket_s:g})"
            )
        if self.lookahead_s >= self.period_s:
            raise ValueError(
                f"lookahead_s ({self.lookahead_s:g}) must be shorter than period_s "
                f"({self.period_s:g})"
            )
        if self.period_s < 2 * self.bucket_s:
            raise ValueError(
                f"period_s ({self.period_s:g}) must hold at least two buckets of bucket_s "
                f"({self.bucket_s:g})"
            )
        return self

    def keys(self, models: Iterable[str], regions: Iterable[str]) -> list[Key]:
        """The (model, region) pools this config pre-warms, of these models and regions."""
        wanted = set(self.models) if self.models is not None else None
        regions = list(regions)
        return [(m, r) for m in models if wanted is None or m in wanted for r in regions]


class RateForecaster:
    """Requests per second expected soon, per key, from counts fed bucket by bucket."""

    def __init__(self, config: PrewarmConfig, keys: Iterable[Key]):
        self.config = config
        self._per_period = round(config.period_s / config.bucket_s)
        self._ahead = max(1, round(config.lookahead_s / config.bucket_s))
        self._keys = list(keys)
        self._index = {key: i for i, key in enumerate(self._keys)}
        self._history = np.zeros((len(self._keys), self._per_period), dtype=np.float64)
        self._seen = np.zeros(self._per_period, dtype=bool)  # buckets with a period of history
        self._ewma = np.zeros(len(self._keys))

    @property
    def keys(self) -> list[Key]:
        return list(self._keys)

    @property
    def buckets_per_period(self) -> int:
        return self._per_period

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
    bucket's demand, it answers the pools that should hold one replica at least."""

    def __init__(self, config: PrewarmConfig, keys: Iterable[Key]):
        self.config = config
        self.interval_s = config.bucket_s
        self.forecaster = RateForecaster(config, keys)

    def floors(self, now_s: float, demand: Mapping[Key, int]) -> dict[Key, int]:
        """`demand`: the requests of the bucket that ends at `now_s` (a bucket boundary)."""
        bucket = round(now_s / self.config.bucket_s)
        if bucket > 0:
            self.forecaster.observe(bucket - 1, demand)  # the bucket that just ended
        expected = self.forecaster.forecast_rps(bucket) * self.config.lookahead_s
        warm = expected >= self.config.min_expected
        return {
            key: 1 for key, hold in zip(self.forecaster.keys, warm.tolist(), strict=True) if hold
        }
