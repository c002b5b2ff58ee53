"""The goal record every suite reports (`goals` in its JSON, gathered by `benchmarks.run` under
`<suite>.<goal>`): a measured value next to its target, met or not; a value that could not be
measured is a miss that says why."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any, NotRequired, TypedDict

UNMEASURED = "not measured: counts as a miss"


class GoalRecord(TypedDict):
    value: float | None
    target: float
    unit: str
    at_most: bool  # the value must stay at or under the target (a cost); else reach it
    met: bool
    missing: NotRequired[str]  # why the value is None
    note: NotRequired[str]  # how to read the value
    met_in: NotRequired[str]  # "k of n": the runs whose own value met the target
    details: NotRequired[dict[str, Any]]  # what the value is made of


def goal(
    value: float | None,
    target: float,
    unit: str,
    *,
    at_most: bool = False,
    missing: str = UNMEASURED,
    note: str | None = None,
    details: Mapping[str, Any] | None = None,
) -> GoalRecord:
    met = value is not None and (value <= target if at_most else value >= target)
    record = GoalRecord(
        value=None if value is None else round(value, 4),
        target=target,
        unit=unit,
        at_most=at_most,
        met=met,
    )
    if value is None:
        record["missing"] = missing
    if note is not None:
        record["note"] = note
    if details is not None:
        record["details"] = dict(details)
    return record


def goal_over_runs(
    values: Sequence[float | None],
    target: float,
    unit: str,
    *,
    at_most: bool = False,
    missing: str = UNMEASURED,
    details: Mapping[str, Any] | None = None,
) -> GoalRecord:
    """A goal judged on the median of several runs' values (those measured), saying in how many
    of the runs it was met; no measured run is a miss that says why."""
    measured = [v for v in values if v is not None]
    value = statistics.median(measured) if measured else None
    record = goal(
        value,
        target,
        unit,
        at_most=at_most,
        missing=missing,
        details={**(details or {}), "per_run": list(values)},
    )
    met = sum(1 for v in measured if (v <= target if at_most else v >= target))
    record["met_in"] = f"{met} of {len(values)}"
    return record


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator to 3 decimals; None when either side was not measured."""
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def dig(tree: Mapping[str, Any], *path: str) -> Any:
    """`tree[path[0]][path[1]]...`, or None where a step is missing (a part that failed)."""
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def goals_table(
    goals: Mapping[str, GoalRecord],
    machine: Mapping[str, Any],
    command: str,
    failed_suites: Mapping[str, str] | None = None,
) -> str:
    """What `make bench` prints at the end: the machine, its load and the command, then each
    goal's value next to its target, met or missed (with why, where it was not measured), then
    each suite that failed whole (its goals are not there) with its error."""
    load = f"{machine.get('load_average_1m')} -> {machine.get('load_average_1m_end')}"
    lines = [
        f"machine: {machine.get('cpus_usable') or machine.get('cpu_count')} CPUs "
        f"({machine.get('platform')}), load average (1 min) {load}",
        f"command: {command}",
    ]
    width = max((len(name) for name in goals), default=0)
    for name, record in goals.items():
        bound = "<=" if record["at_most"] else ">="
        value = "-" if record["value"] is None else f"{record['value']:g}"
        verdict = "met" if record["met"] else "MISSED"
        why = f" ({record['missing']})" if "missing" in record else ""
        if "met_in" in record:
            why = f" in {record['met_in']} runs{why}"
        lines.append(
            f"  {name:<{width}}  {value:>9} {bound} {record['target']:<7g} "
            f"{record['unit']:<16} {verdict}{why}"
        )
    for suite, error in (failed_suites or {}).items():
        lines.append(f"  {suite}: FAILED, no goal measured ({error})")
    return "\n".join(lines)
