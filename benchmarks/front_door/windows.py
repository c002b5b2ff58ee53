"""What each kill cost, from the clients' records alone (plain Python, no Ray): the requests sent
in its window (from the kill to the next one) that failed, the connections refused and for how
long, the /admin answers that were 500s; and issue 43's goals on them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from benchmarks.lib.goals import GoalRecord, goal

Kind = Literal["embedding", "chat", "probe", "admin"]
LOAD_KINDS: frozenset[Kind] = frozenset({"embedding", "chat"})  # non-streaming, pooled
REFUSED = "refused"  # the error label of a connection the port refused
BEFORE = "before"  # the window before the first kill

# Issue 43: per kill no failed non-streaming request, connections refused for at most a second,
# and the admin API never a 500 (a dependency gone is a 503 that says which).
FAILED_TARGET = 0
REFUSED_TARGET_S = 1.0
ADMIN_500_TARGET = 0


@dataclass(frozen=True)
class Outcome:
    """One request as its client saw it."""

    kind: Kind
    sent_s: float
    ended_s: float
    status: int | None  # None: no HTTP answer (see error)
    error: str | None = None  # REFUSED, or the transport error's class name

    @property
    def failed(self) -> bool:
        """A load request with no answer or a 5xx (a 4xx is the client's)."""
        return self.kind in LOAD_KINDS and (self.status is None or self.status >= 500)

    @property
    def refused(self) -> bool:
        return self.kind == "probe" and self.error == REFUSED

    @property
    def admin_500(self) -> bool:
        return self.kind == "admin" and self.status == 500

    @property
    def label(self) -> str:
        return str(self.status) if self.status is not None else str(self.error)


@dataclass(frozen=True)
class Kill:
    target: str
    at_s: float
    pid: int | None  # None: nothing to kill was found (or the deploy failed)
    settled: bool = True  # the front door had settled again before the next kill (or the end)
    why_none: str = "no such process was found to kill"  # what a pid of None means


def window_of(outcomes: Iterable[Outcome], start_s: float, end_s: float) -> list[Outcome]:
    return [o for o in outcomes if start_s <= o.sent_s < end_s]


def refused_window_s(outcomes: Iterable[Outcome]) -> float:
    """From the first refused connection to the last (0: none, or one)."""
    times = [o.sent_s for o in outcomes if o.refused]
    return round(max(times) - min(times), 3) if times else 0.0


def window_summary(outcomes: Sequence[Outcome], since_s: float) -> dict[str, Any]:
    """One window's figures; `since_s` is its start (the kill), which times are counted from."""
    load = [o for o in outcomes if o.kind in LOAD_KINDS]
    failed = [o for o in load if o.failed]
    probes = [o for o in outcomes if o.kind == "probe"]
    refused = [o for o in probes if o.refused]
    admin = [o for o in outcomes if o.kind == "admin"]
    bad_ends = [o.ended_s for o in [*failed, *refused]]
    return {
        "requests": len(load),
        "failed_requests": len(failed),
        "failed_by_kind": dict(Counter(o.kind for o in failed)),
        "failures": dict(Counter(o.label for o in failed)),
        "connections_opened": len(probes),
        "connections_refused": len(refused),
        "refused_window_s": refused_window_s(probes),
        "first_refused_after_s": round(min(o.sent_s for o in refused) - since_s, 3)
        if refused
        else None,
        "probe_answers": dict(Counter(o.label for o in probes)),
        "admin_requests": len(admin),
        "admin_500s": sum(o.admin_500 for o in admin),
        "admin_answers": dict(Counter(o.label for o in admin)),
        # From the kill to the end of the last failure it caused (0: none).
        "failing_for_s": round(max(bad_ends) - since_s, 3) if bad_ends else 0.0,
    }


def by_window(outcomes: Sequence[Outcome], kills: Sequence[Kill], end_s: float) -> dict[str, Any]:
    """`before` (until the first kill), then each kill's window, by the time a request was sent."""
    starts = [0.0, *(k.at_s for k in kills)]
    ends = [*(k.at_s for k in kills), end_s]
    names = [BEFORE, *(k.target for k in kills)]
    windows = {}
    for name, start, end in zip(names, starts, ends, strict=True):
        windows[name] = {
            "window_s": round(end - start, 2),
            **window_summary(window_of(outcomes, start, end), start),
        }
    for kill in kills:
        windows[kill.target].update(pid=kill.pid, settled=kill.settled)
    return windows


def goals(windows: Mapping[str, Mapping[str, Any]], kills: Sequence[Kill]) -> dict[str, GoalRecord]:
    """Per kill: failed requests and the refused window; over the run: /admin's 500s. A kill that
    found nothing to kill is a miss that says so."""
    records: dict[str, GoalRecord] = {}
    for kill in kills:
        figures = windows[kill.target]
        name = kill.target.replace("-", "_")
        missing = f"{kill.target}: {kill.why_none}"
        found = kill.pid is not None
        records[f"{name}_failed_requests"] = goal(
            figures["failed_requests"] if found else None,
            FAILED_TARGET,
            "requests",
            at_most=True,
            missing=missing,
            note=f"non-streaming requests sent from the kill to the next that got a 5xx or no "
            f"answer, of {figures['requests']}",
            details=figures["failures"],
        )
        records[f"{name}_refused_s"] = goal(
            figures["refused_window_s"] if found else None,
            REFUSED_TARGET_S,
            "s",
            at_most=True,
            missing=missing,
            note="first to last refused connection (a new one every probe interval), of "
            f"{figures['connections_opened']} opened, {figures['connections_refused']} refused",
        )
    records["admin_500s"] = goal(
        sum(w["admin_500s"] for w in windows.values()),
        ADMIN_500_TARGET,
        "responses",
        at_most=True,
        note="/admin answers that were 500s over the whole run (every kill's window and before)",
        details={name: w["admin_500s"] for name, w in windows.items()},
    )
    return records
