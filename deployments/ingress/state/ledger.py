"""The usage ledger's one hook: every finished model request's outcome, as the router's
telemetry already has it, becomes one `RequestRecord` and goes to the write-behind queue."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime

from deployments.ingress.state.request_log import RequestRecord
from deployments.ingress.state.write_behind import RecordWriter
from deployments.observability import ModelPrice, RequestOutcome, RequestTelemetry


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


class RequestLedger:
    def __init__(
        self,
        writer: RecordWriter[RequestRecord],
        prices: Mapping[str, ModelPrice],
        wall_clock: Callable[[], float] = time.time,
    ):
        self._writer = writer
        self._prices = dict(prices)
        self._wall_clock = wall_clock
        self._day_number, self._day_text = -1, ""

    def __call__(self, telemetry: RequestTelemetry, outcome: RequestOutcome) -> None:
        """RouterObservability's ledger: requests of a model only (not /v1/models, /admin)."""
        if outcome.operation is not None:
            self._writer.offer(self.record(telemetry, outcome))

    def _day(self, now: float) -> str:
        """`now`'s UTC day, YYYY-MM-DD, formatted once a day (strftime was a fifth of a
        record's cost)."""
        number = int(now // 86400)
        if number != self._day_number:
            self._day_number = number
            self._day_text = datetime.fromtimestamp(number * 86400, UTC).strftime("%Y-%m-%d")
        return self._day_text

    def record(self, telemetry: RequestTelemetry, outcome: RequestOutcome) -> RequestRecord:
        now = self._wall_clock()
        model = telemetry.served_model or outcome.model  # the served name, not an alias
        input_tokens, output_tokens = outcome.input_tokens or 0, outcome.output_tokens or 0
        price = self._prices.get(model or "")
        cost = price.cost(input_tokens, output_tokens) if price and outcome.status < 400 else 0.0
        payload = None
        if telemetry.collect_payload and telemetry.prompt is not None:
            payload = json.dumps(telemetry.prompt, ensure_ascii=False, default=str)
        return RequestRecord(
            ts=now,
            day=self._day(now),
            request_id=telemetry.request_id,
            key_id=outcome.key_id,
            endpoint=outcome.endpoint,
            model=model,
            region=outcome.region,
            colo=outcome.colo,
            route_reason=outcome.route_reason,
            status=outcome.status,
            stream=outcome.stream,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_units=cost,
            latency_ms=round(outcome.latency_s * 1000.0, 3),
            ttft_ms=_ms(outcome.ttft_s) if outcome.stream else None,  # a stream's first token
            cold_start_ms=outcome.cold_start_ms,
            cache=outcome.cache,
            error_type=outcome.error_type,
            payload=payload,
            budget_period=telemetry.budget_period,
            reserved_cost_units=telemetry.reserved_cost_units,
        )
