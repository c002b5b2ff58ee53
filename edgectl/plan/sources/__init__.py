"""Where `edge plan --trace SOURCE:LOCATION` replays a trace from: one module per source, each
reading its own format into edge_sim.plan.replay's requests. A new source (the gateway's request
log: time, model, entry colo per row) is one module with a `trace(location)` and a line here."""

from __future__ import annotations

from collections.abc import Callable

from edge_sim.config import EdgeConfig
from edge_sim.plan.trace import Trace
from edgectl.plan.sources import loadtest

# A source reads LOCATION with the world's edge config at hand (a log that names entry colos
# places its clients at them).
SOURCES: dict[str, Callable[[str, EdgeConfig], Trace]] = {
    "records": loadtest.trace,  # the load tester's requests.csv
}


def replay_source(spec: str, edge: EdgeConfig) -> Callable[[], Trace] | None:
    """`SOURCE:LOCATION` as a trace factory (a trace streams once: one per run); None when
    `spec` names no source."""
    name, colon, location = spec.partition(":")
    read = SOURCES.get(name)
    if read is None or not colon:
        return None
    return lambda: read(location, edge)
