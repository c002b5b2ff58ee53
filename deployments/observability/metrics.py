"""Our Prometheus metrics: each one's name, tags and buckets (`ROUTER_METRICS`, `MODEL_METRICS`),
and what the router and a model replica record in them per request (`RouterMetrics`,
`ModelMetrics`), through a backend of `metrics_backend`. Every tag value comes from a bounded
set (model names, colo ids, HTTP statuses), never from the client as-is.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from deployments.errors import ServingError
from deployments.observability.config import ModelPrice
from deployments.observability.metrics_backend import (
    Counter,
    Gauge,
    Histogram,
    MetricKind,
    MetricsBackend,
)
from deployments.observability.outcome import RequestOutcome
from deployments.observability.timings import InferenceTimings

PREFIX = "edge_"
GEN_AI_PREFIX = "gen_ai_"  # the OpenTelemetry GenAI metrics, named as OTel's Prometheus export does
NO_COLO = "none"  # the request never reached a colo (rejected or failed before routing)
NO_REGION = "none"  # no region served it (never routed, or a drilled colo's failover)
NO_MODEL = "none"  # the request named no model
UNKNOWN_MODEL = "unknown"  # it named one we do not serve: never a client string as a label
OTHER = "_OTHER"  # the GenAI conventions' value for an error.type outside the known set
ROUTE_REASONS = frozenset({"nearest", "warm", "spillover", "failover"})
COLD_START_PHASES = ("process", "model_load", "warmup", "init")

# Buckets: upper bounds, in the unit the name ends with (seconds unless it says otherwise).
LATENCY_S_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# The router's own time per request (x-edge-overhead-ms): sub-millisecond when all is well
OVERHEAD_S_BUCKETS = (0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
COLD_START_S_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120)
TOKENS_PER_S_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
QUEUE_WAIT_S_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# The buckets the GenAI semantic conventions advise for each of their metrics.
GEN_AI_DURATION_S_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
GEN_AI_TTFT_S_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
)  # fmt: skip
GEN_AI_TPOT_S_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
)  # fmt: skip
GEN_AI_TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip


# Tags Ray Serve fills in itself inside a replica; using one as ours is an error there.
@dataclass(frozen=True)
class MetricSpec:
    """One metric as documented in docs/observability.md."""

    kind: MetricKind
    name: str
    description: str
    tag_keys: tuple[str, ...]
    boundaries: tuple[float, ...] = ()

    def make(self, backend: MetricsBackend) -> Counter | Histogram | Gauge:
        if self.kind == "counter":
            return backend.counter(self.name, self.description, self.tag_keys)
        if self.kind == "histogram":
            return backend.histogram(self.name, self.description, self.boundaries, self.tag_keys)
        return backend.gauge(self.name, self.description, self.tag_keys)


_BY_PLACE = ("model", "colo", "region")  # entry colo (simulated), serving region (real)
_BY_KEY = ("key_id", "model")
_GEN_AI = ("gen_ai_operation_name", "gen_ai_request_model")


def _spec(kind: MetricKind, name: str, what: str, tags: tuple[str, ...], buckets=()) -> MetricSpec:
    return MetricSpec(kind, name, what, tags, tuple(buckets))


ROUTER_METRICS: Mapping[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        _spec("counter", PREFIX + "requests_total", "Requests by HTTP status",
              (*_BY_PLACE, "status")),
        _spec("histogram", PREFIX + "request_duration_seconds", "Arrival to last byte",
              _BY_PLACE, LATENCY_S_BUCKETS),
        _spec("histogram", PREFIX + "time_to_first_token_seconds",
              "Streamed chat: arrival to first token sent", _BY_PLACE, GEN_AI_TTFT_S_BUCKETS),
        _spec("counter", PREFIX + "output_tokens_total", "Generated tokens", _BY_PLACE),
        _spec("histogram", PREFIX + "output_tokens_per_second",
              "Generated tokens over the request's duration", _BY_PLACE, TOKENS_PER_S_BUCKETS),
        _spec("counter", PREFIX + "route_decisions_total",
              "Answered requests by route reason (nearest, warm, spillover, failover)",
              (*_BY_PLACE, "reason")),
        _spec("counter", PREFIX + "cold_starts_total", "Requests that waited on a cold start",
              _BY_PLACE),
        _spec("histogram", PREFIX + "cold_start_duration_seconds",
              "Cold-start wait of a request", _BY_PLACE, COLD_START_S_BUCKETS),
        _spec("histogram", PREFIX + "cold_start_phase_seconds",
              "Where the replica's start went (process, model_load, warmup, init)",
              ("model", "phase"), COLD_START_S_BUCKETS),
        _spec("gauge", PREFIX + "last_cold_start_seconds", "The latest cold-start wait",
              _BY_PLACE),
        _spec("counter", PREFIX + "failovers_total",
              "Attempts that failed and passed the request on: a region that failed (colo = the "
              "entry colo), or a drilled entry colo (region = none)", _BY_PLACE),
        _spec("counter", PREFIX + "cache_lookups_total",
              "Response-cache lookups by result (hit, joined, miss)", (*_BY_PLACE, "result")),
        _spec("counter", PREFIX + "cache_backend_failures_total",
              "Response-cache backend calls that failed and became a miss (or an unsaved entry), "
              "by reason (timeout, error, busy, down, corrupt)",
              ("backend", "operation", "reason")),
        _spec("counter", PREFIX + "rate_limited_total", "Requests rejected with 429", _BY_PLACE),
        _spec("histogram", PREFIX + "overhead_seconds",
              "x-edge-overhead-ms: the router's time outside the model replica and its RTT, "
              "until the response started", _BY_PLACE, OVERHEAD_S_BUCKETS),
        _spec("counter", PREFIX + "moderation_flags_total",
              "Moderation inputs flagged, by category", (*_BY_PLACE, "category")),
        _spec("counter", PREFIX + "moderation_gate_failures_total",
              "Moderation gate checks whose classifier failed, by direction (input, output) "
              "and mode (fail_closed: refused with 503; fail_open: passed unchecked)",
              ("direction", "mode")),
        # Usage and cost per authenticated key: key ids are the configured keys', so bounded.
        _spec("counter", PREFIX + "key_requests_total", "Requests per key and model", _BY_KEY),
        _spec("counter", PREFIX + "key_input_tokens_total", "Input tokens per key and model",
              _BY_KEY),
        _spec("counter", PREFIX + "key_output_tokens_total", "Output tokens per key and model",
              _BY_KEY),
        _spec("counter", PREFIX + "key_cost_units_total",
              "Cost units per key and model, from observability.prices", _BY_KEY),
        # OpenTelemetry GenAI semantic conventions, as their Prometheus export names them.
        _spec("histogram", GEN_AI_PREFIX + "server_request_duration_seconds",
              "gen_ai.server.request.duration", (*_GEN_AI, "error_type"),
              GEN_AI_DURATION_S_BUCKETS),
        _spec("histogram", GEN_AI_PREFIX + "server_time_to_first_token_seconds",
              "gen_ai.server.time_to_first_token (streams)", _GEN_AI, GEN_AI_TTFT_S_BUCKETS),
        _spec("histogram", GEN_AI_PREFIX + "client_token_usage",
              "gen_ai.client.token.usage, tokens by gen_ai_token_type (input, output)",
              (*_GEN_AI, "gen_ai_token_type"), GEN_AI_TOKEN_BUCKETS),
    )
}  # fmt: skip

MODEL_METRICS: Mapping[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        _spec("histogram", PREFIX + "model_queue_wait_seconds",
              "In the replica: arrival to first batch", ("model",), QUEUE_WAIT_S_BUCKETS),
        _spec("histogram", PREFIX + "model_batch_size", "Largest batch a request ran in",
              ("model",), BATCH_SIZE_BUCKETS),
        _spec("counter", PREFIX + "model_input_tokens_total", "Input tokens the replica took in",
              ("model",)),
        _spec("counter", PREFIX + "model_cached_input_tokens_total",
              "Of those, read from the replica's prefix cache (chat)", ("model",)),
        _spec("gauge", PREFIX + "model_kv_cache_bytes",
              "Chat: KV cache the replica holds (its prefix cache's included)", ("model",)),
        _spec("gauge", PREFIX + "model_kv_cache_budget_bytes",
              "Chat: the replica's KV budget (kv_budget_mb); absent without one", ("model",)),
        _spec("counter", PREFIX + "model_kv_preemptions_total",
              "Chat: running sequences preempted to keep within the KV budget (resumed later)",
              ("model",)),
        _spec("histogram", GEN_AI_PREFIX + "server_time_per_output_token_seconds",
              "gen_ai.server.time_per_output_token: decode time per token after the first",
              _GEN_AI, GEN_AI_TPOT_S_BUCKETS),
    )
}  # fmt: skip


def _instruments(
    specs: Mapping[str, MetricSpec], backend: MetricsBackend
) -> dict[str, Counter | Histogram | Gauge]:
    return {name: spec.make(backend) for name, spec in specs.items()}


def cost_units(outcome: RequestOutcome, prices: Mapping[str, ModelPrice]) -> float:
    """What a request costs by the price table: successful requests of a priced model only."""
    price = prices.get(outcome.model or "")
    if price is None or outcome.status >= 400:
        return 0.0
    return price.cost(outcome.input_tokens or 0, outcome.output_tokens or 0)


def serving_error_names() -> frozenset[str]:
    """Our closed error set's class names: the bounded values of the error_type label."""
    names, pending = set(), [ServingError]
    while pending:
        cls = pending.pop()
        names.add(cls.__name__)
        pending.extend(cls.__subclasses__())
    return frozenset(names)


def error_type_label(outcome: RequestOutcome, known_errors: Collection[str]) -> str:
    """error.type of the GenAI duration metric: empty on success (Prometheus reads an empty
    label as none), the error class when it is one of ours, else the status or _OTHER."""
    if outcome.status < 400:
        return ""
    if outcome.error_type in known_errors:
        return str(outcome.error_type)
    return str(outcome.status) if 400 <= outcome.status < 600 else OTHER


class _Instruments:
    """Typed access to a process's instruments (`_instruments`), by metric name."""

    def __init__(self, specs: Mapping[str, MetricSpec], backend: MetricsBackend):
        self._metrics = _instruments(specs, backend)

    def _counter(self, name: str) -> Counter:
        return self._metrics[name]  # type: ignore[return-value]

    def _histogram(self, name: str) -> Histogram:
        return self._metrics[name]  # type: ignore[return-value]

    def _gauge(self, name: str) -> Gauge:
        return self._metrics[name]  # type: ignore[return-value]

    def _inc(self, name: str, value: float | None, tags: dict[str, str]) -> None:
        if value:  # Ray's counters refuse increments <= 0
            self._counter(name).inc(value, tags)


class RouterMetrics(_Instruments):
    """The router's metrics per model, colo and region, GenAI metrics per operation and model,
    and usage per key. Make it inside the replica (Ray's metrics bind to the process that
    creates them); `served_models` bounds the model label, `prices` turns tokens into cost."""

    def __init__(
        self,
        backend: MetricsBackend,
        served_models: Collection[str],
        prices: Mapping[str, ModelPrice] | None = None,
    ):
        super().__init__(ROUTER_METRICS, backend)
        self._served = frozenset(served_models)
        self._prices = dict(prices or {})
        self._known_errors = serving_error_names()

    def model_label(self, model: str | None) -> str:
        if model is None:
            return NO_MODEL
        return model if model in self._served else UNKNOWN_MODEL

    def record(self, outcome: RequestOutcome) -> None:
        model = self.model_label(outcome.model)
        tags = {
            "model": model,
            "colo": outcome.colo or NO_COLO,
            "region": outcome.region or NO_REGION,
        }
        self._inc("edge_requests_total", 1, {**tags, "status": str(outcome.status)})
        self._histogram("edge_request_duration_seconds").observe(outcome.latency_s, tags)
        if outcome.status == 429:
            self._inc("edge_rate_limited_total", 1, tags)
        if outcome.overhead_ms is not None:
            self._histogram("edge_overhead_seconds").observe(outcome.overhead_ms / 1000.0, tags)
        if outcome.ttft_s is not None and outcome.stream:
            self._histogram("edge_time_to_first_token_seconds").observe(outcome.ttft_s, tags)
        if outcome.output_tokens:
            self._inc("edge_output_tokens_total", outcome.output_tokens, tags)
            if outcome.latency_s > 0:
                rate = outcome.output_tokens / outcome.latency_s
                self._histogram("edge_output_tokens_per_second").observe(rate, tags)
        if outcome.route_reason is not None and outcome.colo is not None:
            reason = outcome.route_reason if outcome.route_reason in ROUTE_REASONS else "other"
            self._inc("edge_route_decisions_total", 1, {**tags, "reason": reason})
        self._record_cold_start(outcome, model, tags)
        for colo in outcome.skipped_colos:
            self._inc(
                "edge_failovers_total", 1, {"model": model, "colo": colo, "region": NO_REGION}
            )
        for region in outcome.failed_regions:
            self._inc("edge_failovers_total", 1, {**tags, "region": region})
        if outcome.cache is not None:
            self._inc("edge_cache_lookups_total", 1, {**tags, "result": outcome.cache.lower()})
        for category in outcome.flagged_categories:
            self._inc("edge_moderation_flags_total", 1, {**tags, "category": category})
        self._record_usage(outcome, model)
        self._record_gen_ai(outcome, model)

    def cache_backend_failure(self, backend: str, operation: str, reason: str) -> None:
        """A response-cache backend call that failed; the request went on without it."""
        self._inc(
            "edge_cache_backend_failures_total",
            1,
            {"backend": backend, "operation": operation, "reason": reason},
        )

    def moderation_gate_failure(self, direction: str, mode: str) -> None:
        """A moderation gate check whose classifier failed; `mode` says what the request got."""
        self._inc("edge_moderation_gate_failures_total", 1, {"direction": direction, "mode": mode})

    def _record_cold_start(self, outcome: RequestOutcome, model: str, tags: dict[str, str]) -> None:
        if outcome.cold_start_ms is None:
            return
        wait_s = outcome.cold_start_ms / 1000.0
        self._inc("edge_cold_starts_total", 1, tags)
        self._histogram("edge_cold_start_duration_seconds").observe(wait_s, tags)
        self._gauge("edge_last_cold_start_seconds").set(wait_s, tags)
        for phase, seconds in outcome.cold_start_phases:
            if phase in COLD_START_PHASES:
                self._histogram("edge_cold_start_phase_seconds").observe(
                    seconds, {"model": model, "phase": phase}
                )

    def _record_usage(self, outcome: RequestOutcome, model: str) -> None:
        """Per key: only authenticated callers (a key id from the configured keys)."""
        if outcome.key_id is None:
            return
        tags = {"key_id": outcome.key_id, "model": model}
        self._inc("edge_key_requests_total", 1, tags)
        self._inc("edge_key_input_tokens_total", outcome.input_tokens, tags)
        self._inc("edge_key_output_tokens_total", outcome.output_tokens, tags)
        self._inc("edge_key_cost_units_total", cost_units(outcome, self._prices), tags)

    def _record_gen_ai(self, outcome: RequestOutcome, model: str) -> None:
        if outcome.operation is None:
            return  # not a model request (e.g. /v1/models)
        tags = {"gen_ai_operation_name": outcome.operation, "gen_ai_request_model": model}
        error_type = error_type_label(outcome, self._known_errors)
        self._histogram("gen_ai_server_request_duration_seconds").observe(
            outcome.latency_s, {**tags, "error_type": error_type}
        )
        if outcome.ttft_s is not None and outcome.stream and outcome.status < 400:
            self._histogram("gen_ai_server_time_to_first_token_seconds").observe(
                outcome.ttft_s, tags
            )
        usage = self._histogram("gen_ai_client_token_usage")
        for token_type, count in (
            ("input", outcome.input_tokens),
            ("output", outcome.output_tokens),
        ):
            if count:
                usage.observe(count, {**tags, "gen_ai_token_type": token_type})


class ModelMetrics(_Instruments):
    """A model replica's view: queueing, batching and decode speed (Ray adds the replica tag)."""

    def __init__(self, backend: MetricsBackend, model: str, operation: str):
        super().__init__(MODEL_METRICS, backend)
        self._tags = {"model": model}
        self._gen_ai_tags = {"gen_ai_operation_name": operation, "gen_ai_request_model": model}
        self._preemptions = 0  # reported so far

    def record(self, timings: InferenceTimings) -> None:
        queue_wait_s = timings.queue_wait_s
        if queue_wait_s is not None:
            self._histogram("edge_model_queue_wait_seconds").observe(queue_wait_s, dict(self._tags))
        if timings.max_batch_size:
            self._histogram("edge_model_batch_size").observe(
                timings.max_batch_size, dict(self._tags)
            )
        tpot_s = timings.time_per_output_token_s
        if tpot_s is not None:
            self._histogram("gen_ai_server_time_per_output_token_seconds").observe(
                tpot_s, dict(self._gen_ai_tags)
            )

    def kv_cache(self, nbytes: int, budget_bytes: int | None, preemptions: int) -> None:
        """The KV cache's bytes and budget now, and the replica's preemptions so far (the
        counter is advanced by what is new since the last report)."""
        self._gauge("edge_model_kv_cache_bytes").set(nbytes, dict(self._tags))
        if budget_bytes is not None:
            self._gauge("edge_model_kv_cache_budget_bytes").set(budget_bytes, dict(self._tags))
        self._inc(
            "edge_model_kv_preemptions_total", preemptions - self._preemptions, dict(self._tags)
        )
        self._preemptions = max(self._preemptions, preemptions)

    def input_tokens(self, taken: int, cached: int = 0) -> None:
        """A call's input tokens, and how many of them the prefix cache held."""
        self._inc("edge_model_input_tokens_total", taken, dict(self._tags))
        self._inc("edge_model_cached_input_tokens_total", cached, dict(self._tags))
