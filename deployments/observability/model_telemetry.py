"""A model replica's telemetry: each call becomes a span continuing the router's `traceparent`
(a plain argument of the handle call), with GenAI usage and the engine's timings, and feeds the
replica's queue/batch/decode metrics."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType

from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from deployments.observability.attributes import (
    EDGE_CANCELLED,
    ERROR_TYPE,
    GEN_AI_EMBEDDINGS_DIMENSION_COUNT,
    OPERATION_BY_TASK,
    request_attributes,
    span_name,
    usage_attributes,
)
from deployments.observability.config import ObservabilityConfig
from deployments.observability.metrics import ModelMetrics
from deployments.observability.metrics_backend import MetricsBackend, RayServeMetricsBackend
from deployments.observability.outcome import error_status
from deployments.observability.timings import InferenceTimings
from deployments.observability.tracing import context_from_traceparent, setup_tracing


def model_role(model: str) -> str:
    return f"model:{model}"


class ModelCall:
    """One call's span and timings; a context manager that ends the span on exit, also when a
    stream's consumer goes away (GeneratorExit / cancellation: marked, not an error)."""

    def __init__(self, span: Span, timings: InferenceTimings, metrics: ModelMetrics | None):
        self.span = span
        self.timings = timings
        self._metrics = metrics
        self._finish_reasons: list[str] = []

    def usage(
        self,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        finish_reason: str | None = None,
        embedding_dimensions: int | None = None,
        cached_input_tokens: int = 0,
    ) -> None:
        """Once per call (a stream's: with its finishing chunk); `cached_input_tokens`: of the
        input tokens, those the prefix cache held."""
        if finish_reason is not None:
            self._finish_reasons.append(finish_reason)
        self.span.set_attributes(
            usage_attributes(input_tokens=input_tokens, output_tokens=output_tokens)
        )
        if self._metrics is not None and input_tokens:
            self._metrics.input_tokens(input_tokens, cached_input_tokens)
        if embedding_dimensions is not None:
            self.span.set_attribute(GEN_AI_EMBEDDINGS_DIMENSION_COUNT, embedding_dimensions)

    def __enter__(self) -> ModelCall:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        span = self.span
        span.set_attributes(self.timings.attributes())
        if self._finish_reasons:
            span.set_attributes(usage_attributes(finish_reasons=self._finish_reasons))
        if isinstance(error, GeneratorExit | asyncio.CancelledError):
            span.set_attribute(EDGE_CANCELLED, True)
        elif error is not None:
            span.record_exception(error)
            span.set_attribute(ERROR_TYPE, type(error).__name__)
            if error_status(error) >= 500:
                span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()
        if self._metrics is not None and error is None:
            self._metrics.record(self.timings)


class ModelObservability:
    """Made in the model replica's __init__; `call()` per request."""

    def __init__(
        self,
        config: ObservabilityConfig,
        model: str,
        task: str,
        *,
        tracer: Tracer | None = None,
        metrics_backend: MetricsBackend | None = None,
        clock: Callable[[], float] | None = None,
    ):
        self.model = model
        self.operation = OPERATION_BY_TASK.get(task, task)
        self.tracer = (
            tracer if tracer is not None else setup_tracing(config.tracing, model_role(model))
        )
        self.metrics = (
            ModelMetrics(metrics_backend or RayServeMetricsBackend(), model, self.operation)
            if config.metrics
            else None
        )
        self._clock = clock

    def call(
        self,
        traceparent: str | None,
        *,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stream: bool | None = None,
    ) -> ModelCall:
        span = self.tracer.start_span(
            span_name(self.operation, self.model),
            context=context_from_traceparent(traceparent),
            kind=SpanKind.SERVER,
            attributes=request_attributes(
                self.operation,
                self.model,
                max_tokens=max_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=seed,
                stream=stream,
            ),
        )
        timings = InferenceTimings() if self._clock is None else InferenceTimings(self._clock)
        return ModelCall(span, timings, self.metrics)
