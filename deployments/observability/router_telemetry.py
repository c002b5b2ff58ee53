"""The router's per-request telemetry: one SERVER span that continues an incoming W3C trace and
carries the route decision, then one metrics update and one access-log line from the same
`RequestOutcome` once the request ended, behind the responses of that turn of the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from deployments.observability.access_log import AccessLog, api_key_id, configure_access_logger
from deployments.observability.attributes import (
    EDGE_CANCELLED,
    EDGE_REQUEST_ID,
    ERROR_TYPE,
    GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    HTTP_REQUEST_METHOD,
    HTTP_RESPONSE_STATUS_CODE,
    OPERATION_BY_TASK,
    URL_PATH,
    ClientPlace,
    RouteDecision,
    request_attributes,
    route_attributes,
    usage_attributes,
)
from deployments.observability.config import ObservabilityConfig
from deployments.observability.edge_overhead import EdgeOverhead
from deployments.observability.metrics import RouterMetrics
from deployments.observability.metrics_backend import MetricsBackend, RayServeMetricsBackend
from deployments.observability.outcome import CLIENT_CLOSED_REQUEST, RequestOutcome, error_status
from deployments.observability.recent_traffic import RecentTraffic
from deployments.observability.tracing import (
    extract_context,
    setup_tracing,
    trace_id_of,
    traceparent_of,
)

ROUTER_ROLE = "router"
MAX_MODEL_NAME_CHARS = 128  # a client-supplied name, as logged
# AI Gateway's per-request switch of payload logging: "true" keeps this request's payload in
# the request log, "false" keeps it out whatever its key says.
COLLECT_PAYLOAD_HEADER = "cf-aig-collect-log-payload"


class RouterObservability:
    """Made once in the router replica's __init__ (Ray metrics bind to the process that makes
    them). Tests inject the tracer, the metrics backend and the logger. Every finished request
    also goes to `recent` (the live dashboard's last minutes), whatever the config says."""

    def __init__(
        self,
        config: ObservabilityConfig,
        served_models: Collection[str],
        *,
        tracer: Tracer | None = None,
        metrics_backend: MetricsBackend | None = None,
        access_logger: logging.Logger | None = None,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        recent: RecentTraffic | None = None,
        ledger: Callable[[RequestTelemetry, RequestOutcome], None] | None = None,
    ):
        """`ledger`: where each finished request also goes (deployments.ingress.state's request
        log), set once the gateway's state is open."""
        self.config = config
        self.ledger = ledger
        self.recent = (
            recent if recent is not None else RecentTraffic(clock=wall_clock, prices=config.prices)
        )
        self.tracer = tracer if tracer is not None else setup_tracing(config.tracing, ROUTER_ROLE)
        self.metrics = (
            RouterMetrics(metrics_backend or RayServeMetricsBackend(), served_models, config.prices)
            if config.metrics
            else None
        )
        self.access_log = None
        if config.access_log:
            logger = access_logger or configure_access_logger(config.access_log_path)
            self.access_log = AccessLog(logger, config.log_prompts, wall_clock)
        self._clock = clock
        self._unrecorded: list[tuple[RequestTelemetry, RequestOutcome]] = []
        self._flush_on: asyncio.AbstractEventLoop | None = None  # the loop a flush waits on

    def traced(self, path: str) -> bool:
        """An untraced path covers what is under it too (/dashboard: its assets)."""
        return not any(
            path == untraced or path.startswith(untraced.rstrip("/") + "/")
            for untraced in self.config.untraced_paths
        )

    def begin(
        self,
        *,
        method: str,
        path: str,
        headers: Mapping[str, str],
        request_id: str | None = None,
    ) -> RequestTelemetry:
        """Start a request's telemetry; its span continues the request's `traceparent`."""
        lowered = {key.lower(): value for key, value in headers.items()}
        span = self.tracer.start_span(
            f"{method} {path}",
            context=extract_context(lowered),
            kind=SpanKind.SERVER,
            attributes={HTTP_REQUEST_METHOD: method, URL_PATH: path},
        )
        if request_id is None:
            request_id = lowered.get("x-request-id")
        if request_id is not None:
            span.set_attribute(EDGE_REQUEST_ID, request_id)
        return RequestTelemetry(
            span,
            endpoint=path,
            request_id=request_id,
            key_id=api_key_id(lowered.get("authorization")),
            clock=self._clock,
            on_finish=self._record,
            payload_opt_in=_opt_in(lowered.get(COLLECT_PAYLOAD_HEADER)),
        )

    def _record(self, telemetry: RequestTelemetry, outcome: RequestOutcome) -> None:
        """Recorded behind the responses: requests that finish in one turn of the event loop
        are recorded at its next, so answers ready together (a single flight's waiters) are all
        sent before the bookkeeping of any (a quarter to a third of a cache hit's time in the
        router). All on the router's one event loop; outside an event loop, at once."""
        self._unrecorded.append((telemetry, outcome))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        if self._flush_on is not loop:  # none scheduled, or on a loop that ended before it ran
            self._flush_on = loop
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Record the finished requests not recorded yet (also: the replica's shutdown)."""
        self._flush_on = None
        unrecorded, self._unrecorded = self._unrecorded, []
        for telemetry, outcome in unrecorded:
            self._record_now(telemetry, outcome)

    def _record_now(self, telemetry: RequestTelemetry, outcome: RequestOutcome) -> None:
        self.recent.record(outcome)
        if self.metrics is not None:
            self.metrics.record(outcome)
        if self.access_log is not None:
            self.access_log.write(
                outcome,
                request_id=telemetry.request_id,
                key_id=telemetry.key_id,
                trace_id=telemetry.trace_id,
                prompt=telemetry.prompt,
            )
        if self.ledger is not None:
            self.ledger(telemetry, outcome)


def _opt_in(header: str | None) -> bool | None:
    """The payload header as a yes or no; absent or unreadable: None (the key decides)."""
    value = (header or "").strip().lower()
    return True if value == "true" else False if value == "false" else None


def _phases(phases: Mapping[str, float | None] | None) -> tuple[tuple[str, float], ...]:
    """A replica start's phases as (name, seconds), without the `_s` suffix or missing ones."""
    if not phases:
        return ()
    return tuple(
        (name.removesuffix("_s"), float(seconds))
        for name, seconds in phases.items()
        if seconds is not None
    )


class RequestTelemetry:
    """One request's span and measurements. Endpoints add what they learn (`request`, `routed`,
    `usage`, `flagged`); the middleware calls `finish` once the last byte is sent. A disabled
    one (no middleware, e.g. tests with fake handles) accepts the same calls and records
    nothing."""

    def __init__(
        self,
        span: Span,
        *,
        endpoint: str,
        request_id: str | None = None,
        key_id: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_finish: Callable[[RequestTelemetry, RequestOutcome], None] | None = None,
        payload_opt_in: bool | None = None,
    ):
        self.span = span
        self.endpoint = endpoint
        self.request_id = request_id
        self.key_id = key_id
        self.prompt: Any = None
        self._clock = clock
        self._on_finish = on_finish
        self._started = clock()
        self.overhead = EdgeOverhead(clock)  # the router's own time (x-edge-overhead-ms)
        self._first_token_at: float | None = None
        self._model: str | None = None
        self._operation: str | None = None
        self._authenticated_key: str | None = None
        self._stream = False
        self._route: RouteDecision | None = None
        self._client: ClientPlace | None = None
        self._usage: dict[str, Any] = {}
        self._flagged: list[str] = []
        self._error: BaseException | None = None
        self.outcome: RequestOutcome | None = None
        self.overhead_ms: float | None = None  # as sent when the response started
        self._payload_opt_in = payload_opt_in
        self._key_collects_payloads = False
        # What a key's budget decided (deployments.ingress.state.budgets), for its ledger record.
        self.served_model: str | None = None
        self.budget_period: str | None = None
        self.reserved_cost_units = 0.0

    @classmethod
    def disabled(cls) -> RequestTelemetry:
        return cls(trace.INVALID_SPAN, endpoint="")

    @property
    def traceparent(self) -> str | None:
        """Pass this to the model's handle call: its span becomes a child of this one."""
        return traceparent_of(self.span)

    @property
    def trace_id(self) -> str | None:
        return trace_id_of(self.span)

    def request(
        self,
        *,
        task: str,
        model: str,
        stream: bool = False,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        prompt: Any = None,
    ) -> None:
        """What was asked. `prompt` reaches the access log only when log_prompts is on."""
        self._model = model[:MAX_MODEL_NAME_CHARS]
        self._operation = OPERATION_BY_TASK.get(task, task)
        self._stream = stream
        self.prompt = prompt
        self.span.set_attributes(
            request_attributes(
                self._operation,
                self._model,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
                stream=stream,
            )
        )

    def authenticated(self, key_id: str, collect_payloads: bool = False) -> None:
        """The key id the security layer resolved (a named key keeps its name): usage and cost
        are counted per key only from here on, so a label never comes from an unchecked key.
        `collect_payloads`: the key keeps its requests' payloads in the request log."""
        self.key_id = key_id
        self._authenticated_key = key_id
        self._key_collects_payloads = collect_payloads

    @property
    def collect_payload(self) -> bool:
        """Whether the request log keeps this request's payload: the request's header if it
        sent one, else its key's setting."""
        if self._payload_opt_in is not None:
            return self._payload_opt_in
        return self._key_collects_payloads

    def spend_admitted(self, model: str, period: str | None, reserved_cost_units: float) -> None:
        """What the key's budget decided: the model that serves it (its fallback past the
        budget), the period its cost counts in (None: no budget) and what was reserved."""
        self.served_model = model
        self.budget_period = period
        self.reserved_cost_units = reserved_cost_units

    def routed(self, route: RouteDecision, client: ClientPlace | None = None) -> None:
        """Where the edge sent it. Read at `finish`, so a cache result set later still counts."""
        self._route, self._client = route, client

    def first_token(self) -> None:
        """The first generated text went out (the first call counts)."""
        if self._first_token_at is None:
            self._first_token_at = self._clock()

    def usage(
        self,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        finish_reason: str | None = None,
    ) -> None:
        self._usage = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "finish_reason": finish_reason,
        }

    def flagged(self, categories: Iterable[str]) -> None:
        """Moderation categories flagged (one entry per flagged input and category)."""
        self._flagged.extend(categories)

    def failed(self, error: BaseException) -> None:
        """An error after the response started (a stream's error event): it decides the status
        the metrics and log report, since the HTTP status was already sent."""
        self._error = error

    def finish(self, status: int) -> RequestOutcome | None:
        """End the span, record metrics and the log line; later calls do nothing."""
        if self.outcome is not None or self._on_finish is None:
            return self.outcome
        latency_s = self._clock() - self._started
        if self._error is not None:
            status = error_status(self._error)
        route = self._route
        outcome = RequestOutcome(
            endpoint=self.endpoint,
            model=self._model,
            status=status,
            latency_s=latency_s,
            stream=self._stream,
            colo=route.colo if route else None,
            region=route.region if route else None,
            route_reason=route.reason if route else None,
            tried=tuple(route.tried) if route else (),
            skipped_colos=tuple(route.skipped_colos) if route else (),
            failed_regions=tuple(route.failed_regions) if route else (),
            cold_start_ms=route.cold_start_ms if route else None,
            cache=route.cache if route else None,
            ttft_s=None if self._first_token_at is None else self._first_token_at - self._started,
            input_tokens=self._usage.get("input_tokens"),
            output_tokens=self._usage.get("output_tokens"),
            finish_reason=self._usage.get("finish_reason"),
            flagged_categories=tuple(self._flagged),
            error_type=type(self._error).__name__ if self._error is not None else None,
            key_id=self._authenticated_key,
            operation=self._operation,
            cold_start_phases=_phases(route.cold_start_phases) if route else (),
            overhead_ms=self.overhead_ms,
        )
        self.outcome = outcome
        self._end_span(outcome)
        self._on_finish(self, outcome)
        return outcome

    def _end_span(self, outcome: RequestOutcome) -> None:
        span = self.span
        if self._route is not None:
            span.set_attributes(route_attributes(self._route, self._client))
        finish_reasons = [outcome.finish_reason] if outcome.finish_reason else []
        span.set_attributes(
            usage_attributes(
                input_tokens=outcome.input_tokens,
                output_tokens=outcome.output_tokens,
                finish_reasons=finish_reasons,
                response_model=outcome.model if outcome.status < 400 else None,
            )
        )
        span.set_attribute(HTTP_RESPONSE_STATUS_CODE, outcome.status)
        if outcome.stream and outcome.ttft_s is not None:
            span.set_attribute(GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, outcome.ttft_s)
        if outcome.status == CLIENT_CLOSED_REQUEST:
            span.set_attribute(EDGE_CANCELLED, True)
        elif outcome.status >= 400:
            span.set_attribute(ERROR_TYPE, outcome.error_type or str(outcome.status))
        if self._error is not None and outcome.status != CLIENT_CLOSED_REQUEST:
            span.record_exception(self._error)
        if outcome.status >= 500:
            # Server span convention: 4xx is the client's mistake, not this span's error.
            span.set_status(Status(StatusCode.ERROR, outcome.error_type))
        span.end()
