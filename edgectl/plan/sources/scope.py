"""What every replay source takes (the scope it reads LOCATION for) and gives back (the trace
and what it left out)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from edge_sim.config import EdgeConfig
from edge_sim.plan.trace import Trace

_USERINFO = re.compile(r"://[^/\s]*@")  # scheme://user:password@host (up to its last @)
_PASSWORD_PARAMETER = re.compile(r"([?&]password=)[^&\s]*")  # libpq's ?password=...


@dataclass(frozen=True)
class SourceScope:
    """The world's edge config (a log that names entry colos places its clients at them), the
    models the config serves, and a wall-clock window (`--since`/`--until`, unix seconds; only
    a source that knows wall-clock times takes one)."""

    edge: EdgeConfig
    models: tuple[str, ...]
    since_s: float | None = None
    until_s: float | None = None

    @property
    def windowed(self) -> bool:
        return self.since_s is not None or self.until_s is not None


@dataclass(frozen=True)
class Replay:
    """A source's trace and what it left out: reason -> rows (said in the output and the
    report). The trace holds its requests in memory, so every policy's run can read it."""

    trace: Trace
    skipped: dict[str, int] = field(default_factory=dict)
    started_at_s: float | None = None  # wall-clock unix seconds at t = 0, where known

    @property
    def requests(self) -> int:
        return int(self.trace.expected_requests or 0)


def shown(text: str) -> str:
    """LOCATION, or `SOURCE:LOCATION`, as output may show it: any URL in it without its user and
    password."""
    return _PASSWORD_PARAMETER.sub(r"\1...", _USERINFO.sub("://", text))


def skipped_text(skipped: Mapping[str, int]) -> str:
    """`40 client error (4xx), 3 model not served: foo`: most first."""
    ordered = sorted(skipped.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{n:,} {reason}" for reason, n in ordered) or "none"
