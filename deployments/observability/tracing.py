"""One tracer per process and W3C trace-context propagation.

A request's trace crosses processes (router replica -> model replica) through a plain
`traceparent` string passed as an argument of the handle call: Ray Serve's own tracing would link
them only when enabled cluster-wide before start, and it claims the global tracer provider. So our
provider is never installed globally; both can run side by side.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from deployments.observability.attributes import EDGE_PROCESS_ROLE
from deployments.observability.config import OTLP_EXPORTER_MODULES, TracingConfig
from deployments.observability.environment import resolve_tracing_config
from deployments.observability.jsonl import JsonLinesSpanExporter

log = logging.getLogger(__name__)

INSTRUMENTATION_NAME = "ray-edge-ai"
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
_PROPAGATOR = TraceContextTextMapPropagator()  # stateless


def span_exporter(config: TracingConfig) -> SpanExporter | None:
    """The exporter `config` names; the OTLP one is imported only here, when chosen."""
    if config.exporter == "none":
        return None
    if config.exporter == "console":
        return ConsoleSpanExporter(out=sys.stdout)
    if config.exporter == "jsonl":
        assert config.path is not None  # the config validator guarantees it
        return JsonLinesSpanExporter(config.path)
    module = importlib.import_module(OTLP_EXPORTER_MODULES[config.otlp_protocol])
    return module.OTLPSpanExporter(endpoint=config.otlp_endpoint)


def _processor(config: TracingConfig, exporter: SpanExporter) -> SpanProcessor:
    # A network exporter batches off the request path; files and consoles are written at once,
    # so a trace is complete on disk when the response is.
    if config.exporter == "otlp":
        return BatchSpanProcessor(exporter)
    return SimpleSpanProcessor(exporter)


def sampler_of(config: TracingConfig) -> Sampler:
    """The SDK sampler OTEL_TRACES_SAMPLER names; the ratio is sample_ratio."""
    name = config.sampler
    root: Sampler
    if name.endswith("always_on"):
        root = ALWAYS_ON
    elif name.endswith("always_off"):
        root = ALWAYS_OFF
    else:
        root = TraceIdRatioBased(config.sample_ratio)
    return ParentBased(root) if name.startswith("parentbased_") else root


def build_tracer_provider(
    config: TracingConfig, process_role: str, exporter: SpanExporter | None = None
) -> TracerProvider:
    """A provider exporting to `exporter` if given (tests pass an in-memory one), else to the
    exporter `config` names. The resource: config's attributes, then the service name, process
    role and pid (the SDK's own reading of OTEL_RESOURCE_ATTRIBUTES comes first and loses)."""
    resource = Resource.create(
        {
            **config.resource_attributes,
            "service.name": config.service_name,
            EDGE_PROCESS_ROLE: process_role,
            "process.pid": os.getpid(),
        }
    )
    exporter = exporter if exporter is not None else span_exporter(config)
    # With nothing to export to, no span is recorded (its attributes cost the router about a
    # tenth of its own time per request); trace ids are still made, continued and passed on.
    sampler = sampler_of(config) if exporter is not None else ALWAYS_OFF
    provider = TracerProvider(resource=resource, sampler=sampler)
    if exporter is not None:
        provider.add_span_processor(_processor(config, exporter))
    return provider


class _ProcessTracer:
    """The tracer of this process, made on first use. Process-wide on purpose: every span of a
    process must go through one provider, or a file gets each span once per provider."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tracer: Tracer | None = None
        self._made_for: tuple[TracingConfig, str] | None = None

    def get(self, config: TracingConfig, process_role: str) -> Tracer:
        with self._lock:
            if self._tracer is None:
                provider = build_tracer_provider(config, process_role)
                self._tracer = provider.get_tracer(INSTRUMENTATION_NAME)
                self._made_for = (config, process_role)
            elif self._made_for != (config, process_role):
                log.warning(
                    "tracing is already set up in this process for %s; keeping it", self._made_for
                )
            return self._tracer


_PROCESS_TRACER = _ProcessTracer()


def setup_tracing(
    config: TracingConfig, process_role: str, environ: Mapping[str, str] | None = None
) -> Tracer:
    """This process's tracer; idempotent (the first call's settings stay). EDGE_TRACES_FILE in
    `environ` (default: os.environ) overrides the configured exporter."""
    effective = resolve_tracing_config(config, os.environ if environ is None else environ)
    return _PROCESS_TRACER.get(effective, process_role)


# ---- W3C trace context -------------------------------------------------------------------------


def extract_context(headers: Mapping[str, str]) -> Context:
    """The context an incoming request continues: its `traceparent`/`tracestate` headers (any
    case), or the current context when it has none or a malformed one."""
    carrier = {key.lower(): value for key, value in headers.items()}
    return _PROPAGATOR.extract(carrier)


def context_from_traceparent(traceparent: str | None, tracestate: str | None = None) -> Context:
    """The context of a remote parent span named by a `traceparent` string, as a model replica
    receives it; the current context when the string is missing or malformed."""
    carrier = {}
    if traceparent:
        carrier[TRACEPARENT] = traceparent
        if tracestate:
            carrier[TRACESTATE] = tracestate
    return _PROPAGATOR.extract(carrier)


def traceparent_of(span: Span) -> str | None:
    """The `traceparent` that makes a span in another process a child of `span`."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def current_traceparent() -> str | None:
    """The `traceparent` of the current span, None when no valid span is current."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=otel_context.get_current())
    return carrier.get(TRACEPARENT)


def trace_id_of(span: Span) -> str | None:
    """The span's trace id as 32 hex digits, None for a non-recording placeholder span."""
    span_context = span.get_span_context()
    if not span_context.is_valid:
        return None
    return trace.format_trace_id(span_context.trace_id)
