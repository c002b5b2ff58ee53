"""Replayed traces: requests some source recorded (time, model, where the client was) as a
planner trace. Every source (edgectl.plan.sources) reads its own format into `ReplayedRequest`s
and hands them here, so what a trace is stays defined once."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from edge_sim.plan.trace import Trace, TraceChunk
from edge_sim.plan.world import Origin


@dataclass(frozen=True, slots=True)
class ReplayedRequest:
    """One recorded request: when it arrived (seconds from the trace's start), for which model,
    and from which origin (a name `replay_trace` is given the position of)."""

    t_s: float
    model: str
    origin: str


def replay_trace(
    requests: Iterable[ReplayedRequest],
    positions: Mapping[str, tuple[float, float]],
    *,
    source: str = "trace",
) -> Trace:
    """The requests in time order as one chunk; origins and models named by the requests, in
    sorted order. `positions`: origin name -> (lat, lon); `source` names the trace in errors."""
    rows = sorted(requests, key=lambda r: r.t_s)
    unknown = sorted({r.origin for r in rows} - set(positions))
    if unknown:
        raise ValueError(f"{source}: origins without a position: {unknown}")
    origin_names = sorted({r.origin for r in rows})
    models = sorted({r.model for r in rows})
    origins = [Origin(n, *positions[n]) for n in origin_names]
    o_index = {n: i for i, n in enumerate(origin_names)}
    m_index = {n: i for i, n in enumerate(models)}
    t = np.array([r.t_s for r in rows], dtype=float)
    duration = float(t[-1]) + 1.0 if len(t) else 1.0
    chunk = TraceChunk(
        0.0,
        duration,
        t,
        np.array([o_index[r.origin] for r in rows], dtype=np.int32),
        np.array([m_index[r.model] for r in rows], dtype=np.int16),
    )
    return Trace(origins, models, duration, [chunk], float(len(rows)))
