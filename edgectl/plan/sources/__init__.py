"""Where `edge plan --trace SOURCE:LOCATION` replays a trace from: one module per source, each
reading its own format into edge_sim.plan.replay's requests (a `Replay`), and a line in
`SOURCES`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from edgectl.plan.sources import loadtest, request_log
from edgectl.plan.sources.scope import Replay, SourceScope


@dataclass(frozen=True)
class Source:
    read: Callable[[str, SourceScope], Replay]
    location: str  # what LOCATION is, for help and errors


SOURCES: dict[str, Source] = {
    "records": Source(loadtest.replay, "PATH"),  # the load tester's requests.csv
    "request-log": Source(request_log.replay, "SQLITE_FILE|postgresql://URL"),  # the gateway's
}


def replay_source(spec: str, scope: SourceScope) -> Replay | None:
    """`SOURCE:LOCATION` read now; None when `spec` names no source. Raises ValueError (or
    OSError) saying what is wrong with LOCATION."""
    name, colon, location = spec.partition(":")
    source = SOURCES.get(name)
    if source is None or not colon:
        return None
    return source.read(location, scope)


def source_names(separator: str = " or ") -> str:
    """`records:PATH or request-log:...`, for help and errors."""
    return separator.join(f"{name}:{source.location}" for name, source in SOURCES.items())
