"""The numbers of a run: latency percentiles per model, colo, region and phase, error counts,
cold starts (how many, how long, and what they cost against warm requests), replica ranges."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from edgectl.loadtest.records import RequestRecord
from edgectl.loadtest.replicas import ReplicaSample
from edgectl.loadtest.runner import RunResult
from edgectl.loadtest.scenarios import Phase

PERCENTILES = (50, 95, 99)
NO_COLO = "(none)"  # requests that never got an answer naming a colo
# Answers served with no model call of their own: found in the cache (HIT), or an identical
# request's answer waited for while it was made (JOINED); the dashboard's hit ratio counts both.
CACHE_HITS = frozenset({"HIT", "JOINED"})


def latency_stats(values: Iterable[float | None]) -> dict[str, Any]:
    """count, p50/p95/p99, mean and max of the known values (None for an empty set)."""
    known = np.array([v for v in values if v is not None], dtype=float)
    if known.size == 0:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    p50, p95, p99 = np.percentile(known, PERCENTILES)
    return {
        "count": int(known.size),
        "p50": _round(p50),
        "p95": _round(p95),
        "p99": _round(p99),
        "mean": _round(known.mean()),
        "max": _round(known.max()),
    }


def latency_stats_s(values_s: Iterable[float | None]) -> dict[str, Any]:
    """`latency_stats` of durations measured in seconds, reported in milliseconds (a timer's
    seconds in, the same figures as the load tester's out)."""
    return latency_stats(None if value is None else value * 1000.0 for value in values_s)


def error_label(record: RequestRecord) -> str:
    """`http 503`, `stream`, `timeout`, `transport` or `cancelled`."""
    return f"http {record.status}" if record.error_kind == "http" else record.error_kind


def decode_tokens_per_s(record: RequestRecord) -> float | None:
    """Streaming speed after the first token: (tokens - 1) / (last byte - first token)."""
    if record.tokens is None or record.tokens < 2 or record.ttft_ms is None:
        return None
    if record.latency_ms is None or record.latency_ms <= record.ttft_ms:
        return None
    return (record.tokens - 1) / ((record.latency_ms - record.ttft_ms) / 1000)


def group_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Latency figures count successful requests only; failures are counted by label."""
    ok = [r for r in records if r.ok]
    cold = [r for r in records if r.cold_start]
    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": dict(sorted(Counter(error_label(r) for r in records if not r.ok).items())),
        "error_rate": _round(1 - len(ok) / len(records)) if records else None,
        "latency_ms": latency_stats(r.latency_ms for r in ok),
        "ttfb_ms": latency_stats(r.ttfb_ms for r in ok),
        "ttft_ms": latency_stats(r.ttft_ms for r in ok if r.stream),
        "tokens": sum(r.tokens or 0 for r in ok),
        "decode_tokens_per_s": latency_stats(decode_tokens_per_s(r) for r in ok),
        "cache_hits": sum(r.edge.cache in CACHE_HITS for r in records),
        "cache_joined": sum(r.edge.cache == "JOINED" for r in records),  # of cache_hits
        "cold_starts": len(cold),
        "cold_start_ms": latency_stats(r.edge.cold_start_ms for r in cold),
        "warm_latency_ms": latency_stats(r.latency_ms for r in ok if not r.cold_start),
        "cold_latency_ms": latency_stats(r.latency_ms for r in ok if r.cold_start),
    }


def grouped(
    records: Iterable[RequestRecord], key: Callable[[RequestRecord], str]
) -> dict[str, list[RequestRecord]]:
    groups: dict[str, list[RequestRecord]] = defaultdict(list)
    for record in records:
        groups[key(record)].append(record)
    return dict(sorted(groups.items()))


def colo_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    return {
        **group_summary(records),
        "route_reasons": dict(sorted(Counter(r.edge.route_reason or "?" for r in records).items())),
        "rtt_ms": latency_stats(r.edge.rtt_ms for r in records),
    }


def phase_of(t_s: float, phases: Sequence[Phase]) -> str:
    for phase in phases:
        if phase.start_s <= t_s < phase.end_s:
            return phase.name
    return phases[-1].name if phases and t_s >= phases[-1].end_s else "?"


def replica_summary(
    samples: Sequence[ReplicaSample], phases: Sequence[Phase]
) -> dict[str, dict[str, Any]]:
    """Per deployment: sample count, running min/max, running at each phase's start (the last
    sample before it, else the first after it; e.g. 0 at `burst` shows the model had scaled to
    zero before the burst), and replica-seconds within each phase: of replicas running or
    starting (a starting replica already holds its share of a node), and of running ones alone;
    each sample's count held until the next sample, nothing after the last."""
    by_deployment: dict[str, list[ReplicaSample]] = defaultdict(list)
    for sample in samples:
        by_deployment[sample.deployment].append(sample)
    summary = {}
    for name, series in sorted(by_deployment.items()):
        series.sort(key=lambda s: s.t_s)
        at_start: dict[str, int] = {}
        for phase in phases:
            before = [s for s in series if s.t_s <= phase.start_s]
            at_start[phase.name] = (before[-1] if before else series[0]).running
        summary[name] = {
            "samples": len(series),
            "min_running": min(s.running for s in series),
            "max_running": max(s.running for s in series),
            "max_wanted": max(s.wanted for s in series),
            "running_at_phase_start": at_start,
            "replica_s_by_phase": {
                phase.name: _round(_replica_s(series, phase.start_s, phase.end_s, starting=True))
                for phase in phases
            },
            "running_replica_s_by_phase": {
                phase.name: _round(_replica_s(series, phase.start_s, phase.end_s, starting=False))
                for phase in phases
            },
        }
    return summary


def _replica_s(
    series: Sequence[ReplicaSample], start_s: float, end_s: float, *, starting: bool
) -> float:
    """Replicas running (and `starting`: those too, `wanted`) integrated over [start_s, end_s):
    a step through sorted samples."""
    total = 0.0
    for sample, following in zip(series, series[1:], strict=False):
        overlap = min(following.t_s, end_s) - max(sample.t_s, start_s)
        if overlap > 0:
            total += (sample.wanted if starting else sample.running) * overlap
    return total


def summarize(result: RunResult, params: Mapping[str, Any]) -> dict[str, Any]:
    """summary.json's content: JSON-ready, keys sorted, floats rounded to 0.001."""
    records = result.records
    phases = result.schedule.phases
    ok = [r for r in records if r.ok]
    cold = [r for r in records if r.cold_start]
    error_examples: dict[str, str] = {}
    for record in records:
        if not record.ok:
            error_examples.setdefault(error_label(record), record.error)
    # Offered rate over the time traffic was scheduled: idle gaps do not count, and a run cut
    # short counts only the time it ran.
    active_s = sum(
        max(0.0, min(p.end_s, result.elapsed_s) - p.start_s) for p in phases if p.name != "idle"
    )
    return {
        "scenario": result.schedule.scenario,
        "params": dict(params),
        "started_unix_s": _round(result.started_unix_s),
        "elapsed_s": _round(result.elapsed_s),
        "interrupted": result.interrupted,
        "requests": {
            "scheduled": len(result.schedule.arrivals),
            "recorded": len(records),
            "ok": len(ok),
            "errors": len(records) - len(ok),
            "offered_rps": _round(len(records) / active_s) if active_s else None,
            "ok_rps": _round(len(ok) / result.elapsed_s) if result.elapsed_s else None,
        },
        "errors": {
            "by_label": dict(sorted(Counter(error_label(r) for r in records if not r.ok).items())),
            "examples": dict(sorted(error_examples.items())),
        },
        "overall": group_summary(records),
        "send_lag_ms": latency_stats(r.send_lag_ms for r in records),
        "cold_start": {
            "count": len(cold),
            "duration_ms": latency_stats(r.edge.cold_start_ms for r in cold),
            "warm_latency_ms": latency_stats(r.latency_ms for r in ok if not r.cold_start),
            "cold_latency_ms": latency_stats(r.latency_ms for r in ok if r.cold_start),
        },
        "route_reasons": dict(sorted(Counter(r.edge.route_reason or "?" for r in records).items())),
        "cache": dict(sorted(Counter(r.edge.cache or "?" for r in records).items())),
        "failed_over": sum(len(r.edge.failover) > 1 for r in records),
        "by_model": {k: group_summary(v) for k, v in grouped(records, lambda r: r.model).items()},
        "by_colo": {
            k: colo_summary(v) for k, v in grouped(records, lambda r: r.colo or NO_COLO).items()
        },
        "by_region": {k: group_summary(v) for k, v in grouped(records, lambda r: r.region).items()},
        "by_endpoint": {
            k: group_summary(v) for k, v in grouped(records, lambda r: r.endpoint).items()
        },
        "by_phase": {
            k: group_summary(v)
            for k, v in grouped(records, lambda r: phase_of(r.scheduled_s, phases)).items()
        },
        "phases": [
            {"name": p.name, "start_s": _round(p.start_s), "end_s": _round(p.end_s)} for p in phases
        ],
        "replicas": replica_summary(result.replica_samples, phases),
        "replica_sampling": {
            "samples": len(result.replica_samples),
            "errors": result.replica_error_count,
            "recent_errors": list(result.replica_errors),
        },
        "admin_events": [
            {
                "label": e.label,
                "method": e.method,
                "colo": e.colo,
                "scheduled_s": _round(e.scheduled_s),
                "at_s": _round(e.at_s),
                "status": e.status,
                "error": e.error,
            }
            for e in result.admin_events
        ],
    }


def _round(value: float | np.floating[Any]) -> float:
    return round(float(value), 3)
