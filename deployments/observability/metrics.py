"""Prometheus metrics through `ray.serve.metrics`, behind a small backend interface.

Ray exports them on its metrics endpoint with a `ray_` prefix and adds the replica's
deployment/replica/application tags. Outside a Ray worker they record nothing and raise nothing
(Ray 2.60), but they still validate tags; unit tests use `InMemoryMetricsBackend`, which applies
the same checks. Every tag value comes from a bounded set (model names, colo ids, HTTP statuses),
never from the client as-is.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from deployments.observability.outcome import RequestOutcome
from deployments.observability.timings import InferenceTimings

PREFIX = "edge_"
NO_COLO = "none"  # the request never reached a colo (rejected or failed before routing)
NO_MODEL = "none"  # the request named no model
UNKNOWN_MODEL = "unknown"  # it named one we do not serve: never a client string as a label

# Buckets: upper bounds, in the unit the name ends with.
LATENCY_MS_BUCKETS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000)
TTFT_MS_BUCKETS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)
COLD_START_MS_BUCKETS = (100, 250, 500, 1000, 2000, 3000, 5000, 10000, 20000, 30000, 60000, 120000)
TOKENS_PER_S_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
QUEUE_WAIT_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TPOT_MS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)

# Tags Ray Serve fills in itself inside a replica; using one as ours is an error there.
RESERVED_TAG_KEYS = frozenset({"deployment", "replica", "application", "route"})
_METRIC_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class Counter(Protocol):
    def inc(self, value: float, tags: dict[str, str]) -> None: ...


class Histogram(Protocol):
    def observe(self, value: float, tags: dict[str, str]) -> None: ...


class Gauge(Protocol):
    def set(self, value: float, tags: dict[str, str]) -> None: ...


class MetricsBackend(Protocol):
    def counter(self, name: str, description: str, tag_keys: tuple[str, ...]) -> Counter: ...

    def histogram(
        self, name: str, description: str, boundaries: Sequence[float], tag_keys: tuple[str, ...]
    ) -> Histogram: ...

    def gauge(self, name: str, description: str, tag_keys: tuple[str, ...]) -> Gauge: ...


class RayServeMetricsBackend:
    """ray.serve.metrics, imported when the first metric is made (inside the replica).
    (Ray annotates tag_keys as a one-element tuple; any tuple of str is what it takes.)"""

    def counter(self, name: str, description: str, tag_keys: tuple[str, ...]) -> Counter:
        from ray.serve import metrics

        return metrics.Counter(name, description=description, tag_keys=tag_keys)  # type: ignore[arg-type]

    def histogram(
        self, name: str, description: str, boundaries: Sequence[float], tag_keys: tuple[str, ...]
    ) -> Histogram:
        from ray.serve import metrics

        return metrics.Histogram(
            name,
            description=description,
            boundaries=list(boundaries),
            tag_keys=tag_keys,  # type: ignore[arg-type]
        )

    def gauge(self, name: str, description: str, tag_keys: tuple[str, ...]) -> Gauge:
        from ray.serve import metrics

        return metrics.Gauge(name, description=description, tag_keys=tag_keys)  # type: ignore[arg-type]


MetricKind = Literal["counter", "histogram", "gauge"]


@dataclass
class RecordedMetric:
    """A metric of the in-memory backend with every point recorded, checked as Ray checks."""

    kind: MetricKind
    name: str
    description: str
    tag_keys: tuple[str, ...]
    boundaries: tuple[float, ...] = ()
    points: list[tuple[float, dict[str, str]]] = field(default_factory=list)

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self._record("counter", value, tags)

    def observe(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._record("histogram", value, tags)

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._record("gauge", value, tags)

    def _record(self, kind: MetricKind, value: float, tags: dict[str, str] | None) -> None:
        if kind != self.kind:
            raise TypeError(f"{self.name} is a {self.kind}, not a {kind}")
        if not isinstance(value, int | float):
            raise TypeError(f"value must be int or float, got {type(value)}")
        if kind == "counter" and value <= 0:
            raise ValueError(f"value must be >0, got {value}")  # as ray.util.metrics.Counter
        tags = dict(tags or {})
        missing = set(self.tag_keys) - tags.keys()
        unknown = tags.keys() - set(self.tag_keys)
        if missing or unknown:
            raise ValueError(f"{self.name}: missing tags {missing or '{}'}, unknown {unknown}")
        if not all(isinstance(v, str) for v in tags.values()):
            raise TypeError(f"{self.name}: tag values must be str, got {tags}")
        self.points.append((float(value), tags))


class InMemoryMetricsBackend:
    """Keeps every recorded point, for tests and for looking at metrics without Ray."""

    def __init__(self) -> None:
        self.metrics: dict[str, RecordedMetric] = {}

    def _make(
        self,
        kind: MetricKind,
        name: str,
        description: str,
        tag_keys: tuple[str, ...],
        boundaries: Sequence[float] = (),
    ) -> RecordedMetric:
        if not _METRIC_NAME.match(name):
            raise ValueError(f"invalid metric name {name!r}")
        if not isinstance(tag_keys, tuple) or RESERVED_TAG_KEYS & set(tag_keys):
            raise ValueError(
                f"{name}: tag keys must be a tuple without {sorted(RESERVED_TAG_KEYS)}"
            )
        if kind == "histogram" and (
            not boundaries or min(boundaries) <= 0 or list(boundaries) != sorted(boundaries)
        ):
            raise ValueError(f"{name}: boundaries must be positive and ascending")
        if name in self.metrics:
            raise ValueError(f"metric {name} is defined twice")
        metric = RecordedMetric(kind, name, description, tag_keys, tuple(boundaries))
        self.metrics[name] = metric
        return metric

    def counter(self, name: str, description: str, tag_keys: tuple[str, ...]) -> RecordedMetric:
        return self._make("counter", name, description, tag_keys)

    def histogram(
        self, name: str, description: str, boundaries: Sequence[float], tag_keys: tuple[str, ...]
    ) -> RecordedMetric:
        return self._make("histogram", name, description, tag_keys, boundaries)

    def gauge(self, name: str, description: str, tag_keys: tuple[str, ...]) -> RecordedMetric:
        return self._make("gauge", name, description, tag_keys)

    def values(self, name: str, **tags: str) -> list[float]:
        """Recorded values of `name` whose tags include `tags`."""
        return [
            value
            for value, point_tags in self.metrics[name].points
            if all(point_tags.get(key) == want for key, want in tags.items())
        ]

    def total(self, name: str, **tags: str) -> float:
        return sum(self.values(name, **tags))


@dataclass(frozen=True)
class MetricSpec:
    """One metric as documented in deployments/observability/README.md."""

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


_BY_COLO = ("model", "colo")
ROUTER_METRICS: Mapping[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        MetricSpec(
            "counter", PREFIX + "requests_total", "Requests by HTTP status", (*_BY_COLO, "status")
        ),
        MetricSpec(
            "histogram",
            PREFIX + "request_latency_ms",
            "Arrival to last byte, ms",
            _BY_COLO,
            LATENCY_MS_BUCKETS,
        ),
        MetricSpec(
            "histogram",
            PREFIX + "ttft_ms",
            "Streamed chat: arrival to first token sent, ms",
            _BY_COLO,
            TTFT_MS_BUCKETS,
        ),
        MetricSpec("counter", PREFIX + "output_tokens_total", "Generated tokens", _BY_COLO),
        MetricSpec(
            "histogram",
            PREFIX + "output_tokens_per_s",
            "Generated tokens over the request's latency",
            _BY_COLO,
            TOKENS_PER_S_BUCKETS,
        ),
        MetricSpec(
            "counter",
            PREFIX + "cold_starts_total",
            "Requests that waited on a cold start",
            _BY_COLO,
        ),
        MetricSpec(
            "histogram",
            PREFIX + "cold_start_ms",
            "Cold-start wait of a request, ms",
            _BY_COLO,
            COLD_START_MS_BUCKETS,
        ),
        MetricSpec(
            "gauge", PREFIX + "last_cold_start_ms", "The latest cold-start wait, ms", _BY_COLO
        ),
        MetricSpec(
            "counter",
            PREFIX + "failovers_total",
            "Colo attempts that failed and passed the request on; colo = the failed one",
            _BY_COLO,
        ),
        MetricSpec(
            "counter",
            PREFIX + "cache_lookups_total",
            "Response-cache lookups by result (hit, miss)",
            (*_BY_COLO, "result"),
        ),
        MetricSpec(
            "counter", PREFIX + "rate_limited_total", "Requests rejected with 429", _BY_COLO
        ),
        MetricSpec(
            "counter",
            PREFIX + "moderation_flags_total",
            "Moderation inputs flagged, by category",
            (*_BY_COLO, "category"),
        ),
    )
}

MODEL_METRICS: Mapping[str, MetricSpec] = {
    spec.name: spec
    for spec in (
        MetricSpec(
            "histogram",
            PREFIX + "model_queue_wait_ms",
            "In the replica: arrival to first batch, ms",
            ("model",),
            QUEUE_WAIT_MS_BUCKETS,
        ),
        MetricSpec(
            "histogram",
            PREFIX + "model_batch_size",
            "Largest batch a request ran in",
            ("model",),
            BATCH_SIZE_BUCKETS,
        ),
        MetricSpec(
            "histogram",
            PREFIX + "model_time_per_output_token_ms",
            "Decode time per generated token after the first, ms",
            ("model",),
            TPOT_MS_BUCKETS,
        ),
    )
}


def _instruments(
    specs: Mapping[str, MetricSpec], backend: MetricsBackend
) -> dict[str, Counter | Histogram | Gauge]:
    return {name: spec.make(backend) for name, spec in specs.items()}


class RouterMetrics:
    """The router's metrics per model and colo. Make it inside the replica (Ray's metrics bind to
    the process that creates them); `served_models` bounds the model label."""

    def __init__(self, backend: MetricsBackend, served_models: Collection[str]):
        self._served = frozenset(served_models)
        self._metrics = _instruments(ROUTER_METRICS, backend)

    def model_label(self, model: str | None) -> str:
        if model is None:
            return NO_MODEL
        return model if model in self._served else UNKNOWN_MODEL

    def _counter(self, name: str) -> Counter:
        return self._metrics[PREFIX + name]  # type: ignore[return-value]

    def _histogram(self, name: str) -> Histogram:
        return self._metrics[PREFIX + name]  # type: ignore[return-value]

    def _gauge(self, name: str) -> Gauge:
        return self._metrics[PREFIX + name]  # type: ignore[return-value]

    def record(self, outcome: RequestOutcome) -> None:
        model = self.model_label(outcome.model)
        tags = {"model": model, "colo": outcome.colo or NO_COLO}
        self._counter("requests_total").inc(1, {**tags, "status": str(outcome.status)})
        self._histogram("request_latency_ms").observe(outcome.latency_s * 1000.0, tags)
        if outcome.status == 429:
            self._counter("rate_limited_total").inc(1, tags)
        if outcome.ttft_s is not None and outcome.stream:
            self._histogram("ttft_ms").observe(outcome.ttft_s * 1000.0, tags)
        if outcome.output_tokens:  # Ray's counters refuse increments <= 0
            self._counter("output_tokens_total").inc(outcome.output_tokens, tags)
            if outcome.latency_s > 0:
                rate = outcome.output_tokens / outcome.latency_s
                self._histogram("output_tokens_per_s").observe(rate, tags)
        if outcome.cold_start_ms is not None:
            self._counter("cold_starts_total").inc(1, tags)
            self._histogram("cold_start_ms").observe(outcome.cold_start_ms, tags)
            self._gauge("last_cold_start_ms").set(outcome.cold_start_ms, tags)
        for failed in outcome.failed_colos:
            self._counter("failovers_total").inc(1, {"model": model, "colo": failed})
        if outcome.cache is not None:
            self._counter("cache_lookups_total").inc(1, {**tags, "result": outcome.cache.lower()})
        for category in outcome.flagged_categories:
            self._counter("moderation_flags_total").inc(1, {**tags, "category": category})


class ModelMetrics:
    """A model replica's view: queueing, batching and decode speed (Ray adds the replica tag)."""

    def __init__(self, backend: MetricsBackend, model: str):
        self._tags = {"model": model}
        self._metrics = _instruments(MODEL_METRICS, backend)

    def record(self, timings: InferenceTimings) -> None:
        queue_wait_s = timings.queue_wait_s
        if queue_wait_s is not None:
            self._histogram("model_queue_wait_ms").observe(queue_wait_s * 1000.0, dict(self._tags))
        if timings.max_batch_size:
            self._histogram("model_batch_size").observe(timings.max_batch_size, dict(self._tags))
        tpot_s = timings.time_per_output_token_s
        if tpot_s is not None:
            self._histogram("model_time_per_output_token_ms").observe(
                tpot_s * 1000.0, dict(self._tags)
            )

    def _histogram(self, name: str) -> Histogram:
        return self._metrics[PREFIX + name]  # type: ignore[return-value]
