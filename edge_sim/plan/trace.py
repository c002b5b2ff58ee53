"""Traces: when each request arrives, from which origin, for which model. Generated with numpy
(diurnal per origin's local time, follow-the-sun office hours, bursts), or replayed from what a
source recorded (edge_sim.plan.replay). A trace comes in time-ordered chunks, so a day of ten
million requests never sits in memory at once."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from edge_sim.plan.world import Origin

Shape = Literal["flat", "diurnal", "follow-the-sun"]
DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class TraceChunk:
    """Requests in [start_s, end_s), sorted by time; indices into the trace's origins/models."""

    start_s: float
    end_s: float
    t_s: np.ndarray  # float64
    origin: np.ndarray  # int32
    model: np.ndarray  # int16

    def __len__(self) -> int:
        return len(self.t_s)


class Trace:
    """A time-ordered stream of chunks over [0, duration_s)."""

    def __init__(
        self,
        origins: Sequence[Origin],
        models: Sequence[str],
        duration_s: float,
        chunks: Iterator[TraceChunk] | Sequence[TraceChunk],
        expected_requests: float | None = None,
    ):
        self.origins = tuple(origins)
        self.models = tuple(models)
        self.duration_s = duration_s
        self._chunks = chunks
        self.expected_requests = expected_requests

    def chunks(self) -> Iterator[TraceChunk]:
        yield from self._chunks


class Burst(BaseModel):
    """Extra traffic: the rate multiplied by `factor` for a while, at every origin or a few."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)
    factor: float = Field(default=10.0, gt=0)
    origins: list[str] | None = Field(default=None, description="origin names; None: all")


class TraceSpec(BaseModel):
    """A generated trace. The rate at each origin is weight x shape(its local hour), scaled so
    the whole trace expects `requests` requests (bursts add to that)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: float = Field(gt=0, description="expected requests over the trace, before bursts")
    duration_s: float = Field(default=DAY_S, gt=0)
    shape: Shape = "diurnal"
    peak_hour: float = Field(default=14.0, ge=0, lt=24, description="diurnal: local peak")
    trough_ratio: float = Field(
        default=0.05, ge=0, le=1, description="diurnal: the night's rate over the peak's"
    )
    office_hours: tuple[float, float] = Field(
        default=(9.0, 18.0), description="follow-the-sun: local busy hours (the rest: trough)"
    )
    model_shares: dict[str, float] = Field(min_length=1, description="model -> share of requests")
    bursts: list[Burst] = Field(default_factory=list)
    start_utc_hour: float = Field(default=0.0, ge=0, lt=24, description="UTC hour at t = 0")
    bin_s: float = Field(default=60.0, gt=0, description="the rate is constant within a bin")
    chunk_s: float = Field(default=3600.0, gt=0, description="requests generated per chunk")
    seed: int = 0

    @model_validator(mode="after")
    def _shares_positive(self) -> TraceSpec:
        if any(share < 0 for share in self.model_shares.values()) or not sum(
            self.model_shares.values()
        ):
            raise ValueError("model_shares: shares must be >= 0 and not all 0")
        return self


def relative_rate(spec: TraceSpec, local_hour: np.ndarray) -> np.ndarray:
    """The shape's rate at these local hours, peak 1."""
    return daily_rate(
        spec.shape,
        local_hour,
        peak_hour=spec.peak_hour,
        trough_ratio=spec.trough_ratio,
        office_hours=spec.office_hours,
    )


def daily_rate(
    shape: Shape,
    local_hour: np.ndarray,
    *,
    peak_hour: float = 14.0,
    trough_ratio: float = 0.05,
    office_hours: tuple[float, float] = (9.0, 18.0),
) -> np.ndarray:
    """A day's traffic at these local hours, peak 1 (the planner's traces and the load tester's
    diurnal scenario share it)."""
    if shape == "flat":
        return np.ones_like(local_hour)
    floor = trough_ratio
    if shape == "diurnal":
        # A cosine day: 1 at peak_hour, trough_ratio twelve hours away.
        daily = 0.5 + 0.5 * np.cos(2 * math.pi * (local_hour - peak_hour) / 24.0)
        return floor + (1.0 - floor) * daily
    start, end = office_hours
    inside = (local_hour >= start) & (local_hour < end)
    if end <= start:  # office hours past midnight
        inside = (local_hour >= start) | (local_hour < end)
    return np.where(inside, 1.0, floor)


def generate(spec: TraceSpec, origins: Sequence[Origin]) -> Trace:
    """A seeded trace; the same spec and origins give the same requests."""
    weights = np.array([o.weight for o in origins], dtype=float)
    offsets = np.array([o.utc_offset_h for o in origins], dtype=float)
    names = {o.name: i for i, o in enumerate(origins)}
    for burst in spec.bursts:
        unknown = sorted(set(burst.origins or ()) - set(names))
        if unknown:
            raise ValueError(f"bursts: unknown origins {unknown}")
    models = list(spec.model_shares)
    shares = np.array([spec.model_shares[m] for m in models], dtype=float)
    shares /= shares.sum()
    bins = np.arange(0.0, spec.duration_s, spec.bin_s)
    bin_len = np.minimum(spec.bin_s, spec.duration_s - bins)
    # Normalise once over the whole trace: expected total == spec.requests.
    shape = _shape_matrix(spec, bins, offsets) * weights[:, None]
    scale = spec.requests / float((shape * bin_len).sum())

    def chunks() -> Iterator[TraceChunk]:
        rng = np.random.default_rng(spec.seed)
        per_chunk = max(1, round(spec.chunk_s / spec.bin_s))
        for first in range(0, len(bins), per_chunk):
            span = slice(first, first + per_chunk)
            starts, lengths = bins[span], bin_len[span]
            rate = _shape_matrix(spec, starts, offsets) * weights[:, None] * scale
            rate *= _burst_factors(spec, starts, names, len(origins))
            counts = rng.poisson(rate * lengths)  # origins x bins
            origin_of = np.repeat(np.arange(len(origins), dtype=np.int32), counts.sum(axis=1))
            bin_of = np.concatenate([np.repeat(np.arange(len(starts)), row) for row in counts])
            t = starts[bin_of] + rng.uniform(0.0, 1.0, len(bin_of)) * lengths[bin_of]
            order = np.argsort(t, kind="stable")
            model_of = rng.choice(len(models), size=len(t), p=shares).astype(np.int16)
            end = float(starts[-1] + lengths[-1])
            yield TraceChunk(float(starts[0]), end, t[order], origin_of[order], model_of)

    return Trace(origins, models, spec.duration_s, chunks(), spec.requests)


def _shape_matrix(spec: TraceSpec, starts: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    middle_h = (starts + spec.bin_s / 2) / 3600.0 + spec.start_utc_hour
    local = (middle_h[None, :] + offsets[:, None]) % 24.0
    return relative_rate(spec, local)


def _burst_factors(
    spec: TraceSpec, starts: np.ndarray, names: Mapping[str, int], n_origins: int
) -> np.ndarray:
    factors = np.ones((n_origins, len(starts)))
    for burst in spec.bursts:
        during = (starts >= burst.start_s) & (starts < burst.start_s + burst.duration_s)
        rows = [names[n] for n in burst.origins] if burst.origins else slice(None)
        factors[rows, during] *= burst.factor
    return factors
