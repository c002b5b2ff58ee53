"""The load tester's `requests.csv` as a planner trace: each request at its scheduled send time,
from its client region (edgectl.loadtest.regions gives the positions), with what the live run
saw of it kept beside (for comparing a replay with the run)."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edge_sim.plan.replay import ReplayedRequest, replay_trace
from edge_sim.plan.trace import Trace
from edgectl.loadtest.regions import DEFAULT_REGIONS
from edgectl.plan.sources.scope import Replay, SourceScope

CLIENT_POSITIONS = {r.name: (r.lat, r.lon) for r in DEFAULT_REGIONS}


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """What the load tester saw for one request."""

    t_s: float
    model: str
    origin: str
    ok: bool
    latency_ms: float | None
    cold_start: bool
    colo: str
    cold_start_ms: float | None = None


def read_loadtest_records(
    path: str | Path, origin_positions: Mapping[str, tuple[float, float]] = CLIENT_POSITIONS
) -> tuple[Trace, list[RecordedRequest]]:
    """The trace (scheduled send times, model, the client's region as origin) and the recorded
    outcomes, in time order. `origin_positions`: client region -> (lat, lon)."""
    rows: list[RecordedRequest] = []
    with Path(path).open(newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            try:
                rows.append(
                    RecordedRequest(
                        t_s=float(row["scheduled_s"]),
                        model=row["model"],
                        origin=row["region"],
                        ok=row["ok"] in ("1", "True", "true"),
                        latency_ms=float(row["latency_ms"]) if row["latency_ms"] else None,
                        cold_start=row.get("cold_start", "") in ("1", "True", "true"),
                        colo=row.get("colo", ""),
                        cold_start_ms=float(row["cold_start_ms"])
                        if row.get("cold_start_ms")
                        else None,
                    )
                )
            except (KeyError, ValueError) as error:
                raise ValueError(f"{path}:{line}: not a load tester record ({error})") from None
    rows.sort(key=lambda r: r.t_s)
    trace = replay_trace(
        (ReplayedRequest(r.t_s, r.model, r.origin) for r in rows),
        origin_positions,
        source=str(path),
    )
    return trace, rows


def replay(location: str, scope: SourceScope) -> Replay:
    """The `records:PATH` source (clients are where their region says, whatever the colos)."""
    if scope.windowed:
        raise ValueError("--since/--until: a load test's records have no wall-clock times")
    return Replay(read_loadtest_records(location)[0])
