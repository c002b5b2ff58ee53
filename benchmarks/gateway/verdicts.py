"""The gateway suite's goals (issue 44's live goals), from its parts' figures alone: a part that
failed or a figure that could not be taken is a miss that says why."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.lib.goals import GoalRecord, dig, goal, goal_over_runs

SINGLE_FLIGHT_CALLS = 1  # model calls per burst of identical requests
WAITERS_OVER_FIRST_MS = 5.0  # the waiters' p50 past the first's latency
LIGHT_OF_FLOOD_MEDIAN = 0.25  # B's TTFT p99 at most A's median TTFT over 4 ...
LIGHT_OF_ALONE = 3.0  # ... or at most 3x B's own p99 with no flood
RETRY_SUCCESS_SHARE = 0.8  # first retries at the Retry-After that succeed
ESTIMATE_FLOOR_S = 1.0  # an estimate may always be this long ...
ESTIMATE_OF_READY = 2.0  # ... or twice the poller's ready time
OVERHEAD_P50_MS = 1.0  # x-edge-overhead-ms, p50, warm embeddings


def goals(figures: Mapping[str, Any]) -> dict[str, GoalRecord]:
    """`figures`: the suite's parts by name (`single_flight`, `fairness`, `retry_after`,
    `overhead`), each its summary or {"error": ...}."""
    return {
        **single_flight_goals(figures.get("single_flight") or {}),
        **fairness_goals(figures.get("fairness") or {}),
        **retry_after_goals(figures.get("retry_after") or {}),
        **overhead_goals(figures.get("overhead") or {}),
    }


def _why(part: Mapping[str, Any], what: str) -> str:
    error = part.get("error")
    return f"the part failed: {error}" if error else f"not measured: {what}"


def model_calls(single: Mapping[str, Any]) -> tuple[float | None, str]:
    """The model calls per burst and where the count comes from: the chat replicas' own counter
    when Ray exported it (it moved when a model answered), else the answers marked MISS."""
    counted = single.get("model_calls_counted")
    misses = dig(single, "cache", "MISS")
    bursts = single.get("bursts") or 1
    if counted is not None and (counted > 0 or not misses):
        source = "the chat replicas' ray_edge_model_batch_size_count, after minus before"
        return counted / bursts, source
    if single.get("cache") is None:
        return None, "no answer"
    source = "answers marked x-edge-cache: MISS (the replicas' counter unread)"
    return float(misses or 0) / bursts, source


def single_flight_goals(single: Mapping[str, Any]) -> dict[str, GoalRecord]:
    calls, source = model_calls(single)
    answered, sent = single.get("answered"), single.get("requests")
    distinct = single.get("distinct_answers") if answered and answered == sent else None
    unanswered = (
        f"{(sent or 0) - (answered or 0)} of {sent} unanswered ({single.get('statuses')})"
        if sent
        else ""
    )
    return {
        "single_flight_model_calls": goal(
            calls,
            SINGLE_FLIGHT_CALLS,
            "calls",
            at_most=True,
            missing=_why(single, "no model-call count"),
            note=f"per burst of identical cacheable chat requests sent at once; from {source}",
            details={"cache": single.get("cache"), "statuses": single.get("statuses")},
        ),
        "single_flight_distinct_answers": goal(
            distinct,
            1,
            "answers",
            at_most=True,
            missing=_why(single, unanswered or "no answer"),
            note="the most distinct answers in one burst (all equal: 1)",
        ),
        "single_flight_waiters_p50_over_first_ms": goal_over_runs(
            single.get("waiters_p50_over_first_ms") or [],
            WAITERS_OVER_FIRST_MS,
            "ms",
            at_most=True,
            missing=_why(single, "no MISS or no waiter among the answers"),
            details={
                "note": "per burst, the waiters' (JOINED, HIT) latency p50 minus the first's "
                "(MISS); judged on the median over the bursts",
                "first_ms": single.get("first_ms"),
                "waiters_p50_ms": single.get("waiters_p50_ms"),
            },
        ),
    }


def fairness_goals(fairness: Mapping[str, Any]) -> dict[str, GoalRecord]:
    light_p99 = dig(fairness, "light", "ttft_ms", "p99")
    flood_median = dig(fairness, "flood", "ttft_ms", "p50")
    alone_p99 = dig(fairness, "light_alone", "ttft_ms", "p99")
    bounds = {
        "flood_median_over_4_ms": None if flood_median is None else flood_median / 4,
        "light_alone_p99_times_3_ms": None if alone_p99 is None else alone_p99 * LIGHT_OF_ALONE,
    }
    known = [bound for bound in bounds.values() if bound is not None]
    light_refused = [dig(fairness, side, "refused") for side in ("light_alone", "light")]
    refusals = None if None in light_refused else sum(light_refused)
    return {
        "fairness_light_ttft_p99_ms": goal(
            light_p99 if known else None,
            round(max(known), 3) if known else 0.0,
            "ms",
            at_most=True,
            missing=_why(fairness, "no TTFT of B during the flood, or no baseline"),
            note="key B's TTFT p99 while key A floods; the target is the looser of A's median "
            "TTFT / 4 and 3x B's p99 alone (either one met is the goal met)",
            details={
                **{k: None if v is None else round(v, 3) for k, v in bounds.items()},
                "flood_ttft_p50_ms": flood_median,
                "light_alone_ttft_p99_ms": alone_p99,
            },
        ),
        "fairness_light_refusals": goal(
            refusals,
            0,
            "requests",
            at_most=True,
            missing=_why(fairness, "no stream of B"),
            note="key B's streams not answered, alone and during the flood",
            details={
                "alone": dig(fairness, "light_alone", "statuses"),
                "during_flood": dig(fairness, "light", "statuses"),
            },
        ),
        "fairness_flood_refusals_without_retry_after": goal(
            dig(fairness, "flood", "refused_without_retry_after"),
            0,
            "requests",
            at_most=True,
            missing=_why(fairness, "no stream of A"),
            note="key A's 429/503 refusals that came without a Retry-After",
            details={"flood_statuses": dig(fairness, "flood", "statuses")},
        ),
    }


def retry_after_goals(retry: Mapping[str, Any]) -> dict[str, GoalRecord]:
    ready_s = retry.get("ready_median_s")
    # 0.0 is a reading (ready by the time the refusal came back), not a missing one.
    target_s = None if ready_s is None else max(ESTIMATE_FLOOR_S, ESTIMATE_OF_READY * ready_s)
    return {
        "retry_after_first_retry_success_share": goal(
            retry.get("first_retry_success_share"),
            RETRY_SUCCESS_SHARE,
            "share",
            missing=_why(retry, "no 429 with an estimate to retry"),
            note="a model at zero, asked with rejectIfBusy: 429 + retry-after-ms; retried once, "
            "exactly then, with rejectIfBusy again",
            details={
                "retries": retry.get("retries"),
                "succeeded": retry.get("first_retry_succeeded"),
                "retry_statuses": retry.get("retry_statuses"),
            },
        ),
        "retry_after_estimate_s": goal(
            retry.get("estimate_max_s") if target_s is not None else None,
            round(target_s, 4) if target_s is not None else ESTIMATE_FLOOR_S,
            "s",
            at_most=True,
            missing=_why(retry, "no estimate, or the poller never found the model ready"),
            note="the refusals' largest retry-after-ms (the estimate is never to be more), "
            "against max(1 s, 2x the poller's median ready time: refusal to the first poll "
            "answered)",
            details={
                "estimate_median_s": retry.get("estimate_median_s"),
                "ready_median_s": ready_s,
                "estimate_ms": retry.get("estimate_ms"),
                "ready_ms": retry.get("ready_ms"),
            },
        ),
    }


def overhead_goals(overhead: Mapping[str, Any]) -> dict[str, GoalRecord]:
    return {
        "overhead_p50_ms": goal(
            dig(overhead, "overhead_ms", "p50"),
            OVERHEAD_P50_MS,
            "ms",
            at_most=True,
            missing=_why(overhead, "no x-edge-overhead-ms header"),
            note="x-edge-overhead-ms of warm embedding requests sent one at a time",
            details={
                "overhead_ms": overhead.get("overhead_ms"),
                "latency_ms": overhead.get("latency_ms"),
            },
        ),
    }
