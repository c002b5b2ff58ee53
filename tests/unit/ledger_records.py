"""A request-log row for tests of the gateway's store and of what reads it (the planner's
request-log source): one served chat request, changed where a test says."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from deployments.ingress.state.request_log import RequestRecord

NOW = 1_764_633_600.0  # 2025-12-02 00:00 UTC


def record(**changes: Any) -> RequestRecord:
    base = RequestRecord(
        ts=NOW + 10,
        day="2025-12-02",
        request_id="req-1",
        key_id="team-a",
        endpoint="/v1/chat/completions",
        model="glm",
        region="eu",
        colo="FRA",
        route_reason="nearest",
        status=200,
        stream=True,
        input_tokens=12,
        output_tokens=30,
        cost_units=0.5,
        latency_ms=120.5,
        ttft_ms=20.25,
        cold_start_ms=None,
        cache=None,
        error_type=None,
    )
    return replace(base, **changes)
