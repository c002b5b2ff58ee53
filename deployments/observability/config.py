"""Observability settings: the `observability:` block of the app's args. The environment
variables that override them (OTEL_*, EDGE_TRACES_FILE) are applied in `environment.py`."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SpanExporterName = Literal["none", "console", "jsonl", "otlp"]
OtlpProtocol = Literal["http", "grpc"]
# The OpenTelemetry SDK's sampler names (OTEL_TRACES_SAMPLER); parent-based ones follow an
# incoming trace's sampled flag.
SamplerName = Literal[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
]
# The optional exporter packages: opentelemetry-exporter-otlp-proto-http / -proto-grpc ==1.45.2.
OTLP_EXPORTER_MODULES: Mapping[str, str] = {
    "http": "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "grpc": "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def module_available(name: str) -> bool:
    """Whether `name` can be imported, without importing it (a missing parent package counts)."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


class TracingConfig(_Strict):
    """Where finished spans go. `jsonl` appends one JSON object per span to `path`, from every
    process; `otlp` needs the optional OTLP exporter package and an endpoint."""

    exporter: SpanExporterName = "none"
    path: str | None = Field(default=None, description="the JSON-lines file (exporter: jsonl)")
    otlp_endpoint: str | None = Field(
        default=None, description="e.g. http://collector:4318/v1/traces (exporter: otlp)"
    )
    otlp_protocol: OtlpProtocol = "http"
    service_name: str = Field(default="ray-edge-ai", min_length=1)
    resource_attributes: dict[str, str] = Field(
        default_factory=dict, description="on every span's resource, e.g. deployment.environment"
    )
    sampler: SamplerName = "parentbased_traceidratio"
    sample_ratio: float = Field(
        default=1.0, ge=0.0, le=1.0, description="for the traceidratio samplers"
    )

    @model_validator(mode="after")
    def _exporter_has_what_it_needs(self) -> TracingConfig:
        if self.exporter == "jsonl" and not self.path:
            raise ValueError("tracing.exporter 'jsonl' needs tracing.path")
        if self.exporter == "otlp":
            if not self.otlp_endpoint:
                raise ValueError("tracing.exporter 'otlp' needs tracing.otlp_endpoint")
            # Checked here, when the app is built, so a missing package fails `serve run` once
            # instead of every replica start.
            module = OTLP_EXPORTER_MODULES[self.otlp_protocol]
            if not module_available(module):
                package = f"opentelemetry-exporter-otlp-proto-{self.otlp_protocol}==1.45.2"
                raise ValueError(f"tracing.exporter 'otlp' needs the package {package}")
        return self


class ModelPrice(_Strict):
    """What one request to a model costs, in cost units (cents, credits, "neurons": the unit is
    the operator's): a fixed part plus a price per million input and output tokens."""

    per_request: float = Field(default=0.0, ge=0)
    per_million_input_tokens: float = Field(default=0.0, ge=0)
    per_million_output_tokens: float = Field(default=0.0, ge=0)

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        return (
            self.per_request
            + input_tokens * self.per_million_input_tokens / 1e6
            + output_tokens * self.per_million_output_tokens / 1e6
        )


class ObservabilityConfig(_Strict):
    """Traces, metrics and the access log of the router and the model replicas."""

    tracing: TracingConfig = TracingConfig()
    metrics: bool = Field(default=True, description="record ray.serve.metrics (Prometheus)")
    access_log: bool = Field(default=True, description="one JSON line per request")
    access_log_path: str | None = Field(
        default=None, description="append the access log to this file; None: stderr"
    )
    log_prompts: bool = Field(
        default=False, description="put prompt text in the access log (off: it may be personal)"
    )
    untraced_paths: tuple[str, ...] = Field(
        default=("/healthz", "/readyz", "/dashboard", "/admin/dashboard-data"),
        description="probes and the dashboard's polling (and what is under them): no span, "
        "metric or log line",
    )
    prices: dict[str, ModelPrice] = Field(
        default_factory=dict,
        description="per served model: cost units counted per key (edge_key_cost_units_total)",
    )
