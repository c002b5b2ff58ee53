"""Traces, metrics and access logs of the router and the model replicas; docs/observability.md
lists the metric names. Nothing in this package imports Ray until a Ray metric is made."""

from deployments.observability.access_log import (
    AccessLog,
    access_log_record,
    api_key_id,
    configure_access_logger,
)
from deployments.observability.config import ModelPrice, ObservabilityConfig, TracingConfig
from deployments.observability.environment import EDGE_TRACES_FILE_ENV, resolve_tracing_config
from deployments.observability.metrics import ModelMetrics, RouterMetrics
from deployments.observability.metrics_backend import (
    InMemoryMetricsBackend,
    MetricsBackend,
    RayServeMetricsBackend,
)
from deployments.observability.middleware import TelemetryMiddleware, request_telemetry
from deployments.observability.model_telemetry import ModelCall, ModelObservability
from deployments.observability.outcome import RequestOutcome
from deployments.observability.router_telemetry import RequestTelemetry, RouterObservability
from deployments.observability.timings import InferenceTimings
from deployments.observability.tracing import (
    build_tracer_provider,
    context_from_traceparent,
    current_traceparent,
    extract_context,
    setup_tracing,
    traceparent_of,
)

__all__ = [
    "EDGE_TRACES_FILE_ENV",
    "AccessLog",
    "InMemoryMetricsBackend",
    "InferenceTimings",
    "MetricsBackend",
    "ModelCall",
    "ModelMetrics",
    "ModelObservability",
    "ModelPrice",
    "ObservabilityConfig",
    "RayServeMetricsBackend",
    "RequestOutcome",
    "RequestTelemetry",
    "RouterMetrics",
    "RouterObservability",
    "TelemetryMiddleware",
    "TracingConfig",
    "access_log_record",
    "api_key_id",
    "build_tracer_provider",
    "configure_access_logger",
    "context_from_traceparent",
    "current_traceparent",
    "extract_context",
    "request_telemetry",
    "resolve_tracing_config",
    "setup_tracing",
    "traceparent_of",
]
