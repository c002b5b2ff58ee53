"""Observability without Ray: one trace across router and model span (linked by a traceparent
string), the JSON-lines span file shared by processes, metrics in a fake backend, the access log."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id
from pydantic import ValidationError

from deployments.errors import ContextLengthExceededError, InternalServerError, ModelNotFoundError
from deployments.ingress.api.errors import ErrorShapes, install_error_handler
from deployments.observability import attributes as attrs
from deployments.observability import config as config_module
from deployments.observability.access_log import (
    AccessLog,
    api_key_id,
    configure_access_logger,
)
from deployments.observability.config import (
    OTLP_EXPORTER_MODULES,
    ObservabilityConfig,
    TracingConfig,
)
from deployments.observability.environment import EDGE_TRACES_FILE_ENV, resolve_tracing_config
from deployments.observability.metrics import (
    MODEL_METRICS,
    ROUTER_METRICS,
    ModelMetrics,
    RouterMetrics,
)
from deployments.observability.metrics_backend import InMemoryMetricsBackend, RayServeMetricsBackend
from deployments.observability.middleware import TelemetryMiddleware, request_telemetry
from deployments.observability.model_telemetry import ModelObservability
from deployments.observability.outcome import RequestOutcome
from deployments.observability.router_telemetry import RequestTelemetry, RouterObservability
from deployments.observability.timings import InferenceTimings
from deployments.observability.tracing import (
    build_tracer_provider,
    context_from_traceparent,
    current_traceparent,
    extract_context,
    span_exporter,
)

REPO = Path(__file__).resolve().parents[2]
SERVED = ("glm", "kimi", "embedding", "moderation")
PROMPT = "tell nobody: the launch code is 0000"
API_KEY = "sk-test-7f3a9c"
HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")
INCOMING_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INCOMING_SPAN = "00f067aa0ba902b7"


class FakeClock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeRoute:
    """Shaped like deployments.ingress.edge.EdgeTrace."""

    colo: str = "LHR"
    region: str = "eu"
    rtt_ms: float = 12.5
    reason: str = "failover"
    # FRA's drill failed the request, LHR became the entry; region us failed, eu answered.
    tried: list[str] = field(default_factory=lambda: ["FRA", "us", "eu"])
    skipped_colos: tuple[str, ...] = ("FRA",)
    failed_regions: tuple[str, ...] = ("us",)
    cold_start_ms: float | None = 2400.0
    cache: str | None = None
    cold_start_phases: dict[str, float | None] | None = field(
        default_factory=lambda: {"process_s": 0.5, "model_load_s": 1.5, "warmup_s": 0.2}
    )


@dataclass
class FakeClient:
    lat: float = 48.8566
    lon: float = 2.3522
    source: str = "header"
    country: str | None = "FR"


@dataclass
class Tracing:
    exporter: InMemorySpanExporter
    router: TracerProvider
    model: TracerProvider

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())


@pytest.fixture
def tracing() -> Iterator[Tracing]:
    """Two providers as in two processes, one in-memory exporter to look at both."""
    exporter = InMemorySpanExporter()
    config = TracingConfig()
    router = build_tracer_provider(config, "router", exporter)
    model = build_tracer_provider(config, "model:glm", exporter)
    yield Tracing(exporter, router, model)
    router.shutdown()
    model.shutdown()


def make_router(
    tracing: Tracing,
    backend: InMemoryMetricsBackend | None = None,
    log_stream: io.StringIO | None = None,
    clock: FakeClock | None = None,
    **config: Any,
) -> RouterObservability:
    logger = configure_access_logger(stream=log_stream or io.StringIO())
    return RouterObservability(
        ObservabilityConfig(**config),
        SERVED,
        tracer=tracing.router.get_tracer("test"),
        metrics_backend=backend or InMemoryMetricsBackend(),
        access_logger=logger,
        clock=clock or FakeClock(),
        wall_clock=lambda: 1_700_000_000.0,
    )


def make_model(tracing: Tracing, backend: InMemoryMetricsBackend, clock: FakeClock):
    return ModelObservability(
        ObservabilityConfig(),
        "glm",
        "chat",
        tracer=tracing.model.get_tracer("test"),
        metrics_backend=backend,
        clock=clock,
    )


def in_fresh_context(fn: Callable[[], Any]) -> Any:
    """Run as another process would: nothing of the caller's OpenTelemetry context is current."""
    return contextvars.Context().run(fn)


def by_name(spans: Sequence[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


# ---- one trace: router span + model span --------------------------------------------------------


def test_router_and_model_span_share_one_trace_with_genai_and_edge_attributes(tracing: Tracing):
    clock = FakeClock()
    model_metrics = InMemoryMetricsBackend()
    router = make_router(tracing, clock=clock)
    model = make_model(tracing, model_metrics, clock)

    telemetry = router.begin(method="POST", path="/v1/chat/completions", headers={})
    telemetry.request(task="chat", model="glm", max_tokens=64, temperature=0.7, top_p=0.9)
    traceparent = telemetry.traceparent
    assert traceparent is not None

    def replica() -> None:  # what ChatServer.complete does with the string it received
        with model.call(traceparent, max_tokens=64, temperature=0.7) as call:
            clock.advance(0.030)  # waits for a batch slot
            call.timings.admitted()
            clock.advance(0.020)
            call.timings.prefilled(0.020, batch_size=3)
            for _ in range(4):
                clock.advance(0.010)
                call.timings.decoded(0.010, batch_size=5)
            call.usage(
                input_tokens=11, output_tokens=5, finish_reason="length", cached_input_tokens=8
            )

    in_fresh_context(replica)
    telemetry.routed(FakeRoute(), FakeClient())
    telemetry.usage(input_tokens=11, output_tokens=5, finish_reason="length")
    telemetry.finish(200)

    spans = by_name(tracing.spans())
    assert set(spans) == {"POST /v1/chat/completions", "chat glm"}
    router_span, model_span = spans["POST /v1/chat/completions"], spans["chat glm"]
    assert model_span.context.trace_id == router_span.context.trace_id
    assert model_span.parent is not None and model_span.parent.is_remote
    assert model_span.parent.span_id == router_span.context.span_id
    assert router_span.parent is None  # no incoming traceparent: a new trace
    assert router_span.kind == model_span.kind == SpanKind.SERVER
    assert router_span.resource.attributes[attrs.EDGE_PROCESS_ROLE] == "router"
    assert model_span.resource.attributes[attrs.EDGE_PROCESS_ROLE] == "model:glm"

    routed = router_span.attributes
    assert routed[attrs.GEN_AI_OPERATION_NAME] == "chat"
    assert routed[attrs.GEN_AI_REQUEST_MODEL] == "glm"
    assert routed[attrs.GEN_AI_REQUEST_MAX_TOKENS] == 64
    assert routed[attrs.GEN_AI_REQUEST_TEMPERATURE] == 0.7
    assert routed[attrs.GEN_AI_USAGE_INPUT_TOKENS] == 11
    assert routed[attrs.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert routed[attrs.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
    assert routed[attrs.EDGE_COLO] == "LHR"
    assert routed[attrs.EDGE_RTT_MS] == 12.5
    assert routed[attrs.EDGE_ROUTE_REASON] == "failover"
    assert routed[attrs.EDGE_FAILOVER] is True
    assert routed[attrs.EDGE_REGION] == "eu"
    assert routed[attrs.EDGE_TRIED_COLOS] == ("FRA", "us", "eu")
    assert routed[attrs.EDGE_COLD_START] is True
    assert routed[attrs.EDGE_COLD_START_MS] == 2400.0
    assert attrs.EDGE_CACHE not in routed  # not cacheable: no cache attribute at all
    assert routed[attrs.EDGE_CLIENT_COUNTRY] == "FR"
    assert (routed[attrs.EDGE_CLIENT_LAT], routed[attrs.EDGE_CLIENT_LON]) == (48.9, 2.4)
    assert routed[attrs.HTTP_RESPONSE_STATUS_CODE] == 200

    inside = model_span.attributes
    assert inside[attrs.GEN_AI_OPERATION_NAME] == "chat"
    assert inside[attrs.GEN_AI_REQUEST_MODEL] == "glm"
    assert inside[attrs.GEN_AI_USAGE_OUTPUT_TOKENS] == 5
    assert inside[attrs.GEN_AI_RESPONSE_FINISH_REASONS] == ("length",)
    assert inside[attrs.EDGE_MODEL_QUEUE_WAIT_MS] == pytest.approx(30.0)
    assert inside[attrs.EDGE_MODEL_PREFILL_MS] == pytest.approx(20.0)
    assert inside[attrs.EDGE_MODEL_DECODE_MS] == pytest.approx(40.0)
    assert inside[attrs.EDGE_MODEL_DECODE_STEPS] == 4
    assert inside[attrs.EDGE_MODEL_BATCH_SIZE] == 5
    assert inside[attrs.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] == pytest.approx(0.050)

    assert model_metrics.values("edge_model_queue_wait_seconds", model="glm") == [
        pytest.approx(0.030)
    ]
    assert model_metrics.values("edge_model_batch_size", model="glm") == [5]
    assert model_metrics.values("edge_model_input_tokens_total", model="glm") == [11]
    assert model_metrics.values("edge_model_cached_input_tokens_total", model="glm") == [8]
    tpot = model_metrics.values(
        "gen_ai_server_time_per_output_token_seconds",
        gen_ai_operation_name="chat",
        gen_ai_request_model="glm",
    )
    assert tpot == [pytest.approx(0.010)]


def test_an_incoming_traceparent_is_continued_down_to_the_model(tracing: Tracing):
    router = make_router(tracing)
    model = make_model(tracing, InMemoryMetricsBackend(), FakeClock())
    headers = {"Traceparent": f"00-{INCOMING_TRACE}-{INCOMING_SPAN}-01"}  # any header case
    telemetry = router.begin(method="POST", path="/v1/chat/completions", headers=headers)
    telemetry.request(task="chat", model="glm")
    traceparent = telemetry.traceparent
    in_fresh_context(lambda: model.call(traceparent).__exit__(None, None, None))
    telemetry.finish(200)

    spans = by_name(tracing.spans())
    router_span, model_span = spans["POST /v1/chat/completions"], spans["chat glm"]
    assert format_trace_id(router_span.context.trace_id) == INCOMING_TRACE
    assert router_span.parent is not None
    assert format_span_id(router_span.parent.span_id) == INCOMING_SPAN
    assert format_trace_id(model_span.context.trace_id) == INCOMING_TRACE
    assert model_span.parent is not None
    assert model_span.parent.span_id == router_span.context.span_id
    assert traceparent == (f"00-{INCOMING_TRACE}-{format_span_id(router_span.context.span_id)}-01")


def test_a_malformed_traceparent_starts_a_new_trace(tracing: Tracing):
    router = make_router(tracing)
    bad = {"traceparent": f"zz-{INCOMING_TRACE}-{INCOMING_SPAN}-01"}
    in_fresh_context(lambda: router.begin(method="GET", path="/v1/models", headers=bad).finish(200))
    (span,) = tracing.spans()
    assert span.parent is None
    assert format_trace_id(span.context.trace_id) != INCOMING_TRACE


def test_an_unsampled_incoming_trace_is_not_exported_but_still_propagated(tracing: Tracing):
    router = make_router(tracing)
    headers = {"traceparent": f"00-{INCOMING_TRACE}-{INCOMING_SPAN}-00"}
    telemetry = router.begin(method="POST", path="/v1/embeddings", headers=headers)
    assert telemetry.traceparent is not None and telemetry.traceparent.endswith("-00")
    assert telemetry.trace_id == INCOMING_TRACE
    telemetry.finish(200)
    assert tracing.spans() == []


def test_traceparent_helpers_round_trip(tracing: Tracing):
    tracer = tracing.router.get_tracer("test")

    def check() -> None:
        assert current_traceparent() is None  # nothing current
        with tracer.start_as_current_span("outer") as outer:
            traceparent = current_traceparent()
            context = outer.get_span_context()
            trace_hex, span_hex = format_trace_id(context.trace_id), format_span_id(context.span_id)
            assert traceparent is not None
            assert traceparent.startswith(f"00-{trace_hex}-{span_hex}-")
            assert int(traceparent[-2:], 16) & 1  # the sampled flag
        assert current_traceparent() is None
        child = tracer.start_span("child", context=context_from_traceparent(traceparent))
        child.end()
        root = tracer.start_span("root", context=context_from_traceparent(None))
        root.end()
        assert extract_context({}) == extract_context({"traceparent": "garbage"})

    in_fresh_context(check)
    spans = by_name(tracing.spans())
    assert spans["child"].parent is not None
    assert spans["child"].parent.span_id == spans["outer"].context.span_id
    assert spans["child"].context.trace_id == spans["outer"].context.trace_id
    assert spans["root"].parent is None


def test_a_model_call_left_by_its_consumer_is_marked_cancelled_not_failed(tracing: Tracing):
    backend = InMemoryMetricsBackend()
    model = make_model(tracing, backend, FakeClock())

    async def stream() -> Any:
        with model.call(None, stream=True):
            yield "first"
            yield "never"

    async def consume_one() -> None:
        generator = stream()
        assert await generator.__anext__() == "first"
        await generator.aclose()  # the router cancelled the stream

    asyncio.run(consume_one())
    (span,) = tracing.spans()
    assert span.attributes[attrs.EDGE_CANCELLED] is True
    assert span.status.status_code == StatusCode.UNSET
    assert backend.values("edge_model_queue_wait_seconds") == []  # incomplete: not measured


@pytest.mark.parametrize(
    ("error", "status_code"),
    [
        (ContextLengthExceededError("too long", param="messages"), StatusCode.UNSET),
        (InternalServerError("boom"), StatusCode.ERROR),
    ],
)
def test_a_failed_model_call_records_its_error(tracing: Tracing, error, status_code):
    model = make_model(tracing, InMemoryMetricsBackend(), FakeClock())
    with pytest.raises(type(error)), model.call(None):
        raise error
    (span,) = tracing.spans()
    assert span.attributes[attrs.ERROR_TYPE] == type(error).__name__
    assert span.status.status_code == status_code
    assert [event.name for event in span.events] == ["exception"]


def test_our_genai_attribute_names_are_the_semantic_conventions():
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as semconv

    ours = {name: value for name, value in vars(attrs).items() if name.startswith("GEN_AI_")}
    assert len(ours) >= 10
    for name, value in ours.items():
        assert getattr(semconv, name) == value, name


# ---- exporters and the JSON-lines file ----------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import json, sys
    from deployments.observability.config import TracingConfig
    from deployments.observability.tracing import setup_tracing

    config = TracingConfig.model_validate_json(sys.argv[1])
    role, count, payload = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    tracer = setup_tracing(config, role)
    again = setup_tracing(config, role)  # idempotent: the same tracer, spans written once
    print(json.dumps({"same_tracer": again is tracer}))
    for i in range(count):
        with tracer.start_as_current_span("parent") as parent:
            parent.set_attribute("i", i)
            with tracer.start_as_current_span("child") as child:
                child.set_attribute("payload", role[0] * payload)  # lines longer than PIPE_BUF
    """
)


def run_writers(jobs: list[tuple[TracingConfig, str, dict[str, str]]], count: int, payload: int):
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                WRITER,
                config.model_dump_json(),
                role,
                str(count),
                str(payload),
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO), **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for config, role, env in jobs
    ]
    outputs = [process.communicate(timeout=60) for process in processes]
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
        assert json.loads(out) == {"same_tracer": True}


def test_two_processes_append_whole_span_lines_to_one_file(tmp_path: Path):
    traces = tmp_path / "spans" / "traces.jsonl"
    count, payload = 150, 6000
    env_without_override = {EDGE_TRACES_FILE_ENV: ""}
    run_writers(
        [
            (TracingConfig(exporter="jsonl", path=str(traces)), "router", env_without_override),
            # This one's config exports nothing: the environment variable sends it to the file.
            (TracingConfig(exporter="none"), "model:glm", {EDGE_TRACES_FILE_ENV: str(traces)}),
        ],
        count,
        payload,
    )
    lines = traces.read_text().splitlines()
    assert len(lines) == 2 * 2 * count  # a parent and a child per iteration, per process
    records = [json.loads(line) for line in lines]  # a torn line would not parse
    for record in records:
        assert HEX32.match(record["trace_id"]) and HEX16.match(record["span_id"])
        assert record["parent_span_id"] is None or HEX16.match(record["parent_span_id"])
        assert record["name"] in {"parent", "child"}
        assert 0 < record["start_time_unix_nano"] <= record["end_time_unix_nano"]
        assert isinstance(record["attributes"], dict)
    by_role = {
        role: [r for r in records if r["process_role"] == role] for role in ("router", "model:glm")
    }
    assert {role: len(rs) for role, rs in by_role.items()} == {"router": 300, "model:glm": 300}
    span_ids = {r["span_id"]: r for r in records}
    for role, role_records in by_role.items():
        assert len({r["pid"] for r in role_records}) == 1
        for child in (r for r in role_records if r["name"] == "child"):
            assert child["attributes"]["payload"] == role[0] * payload
            parent = span_ids[child["parent_span_id"]]
            assert parent["name"] == "parent" and parent["trace_id"] == child["trace_id"]


def test_edge_traces_file_overrides_the_configured_exporter(tmp_path: Path):
    configured = TracingConfig(exporter="console", service_name="edge")
    assert resolve_tracing_config(configured, {}) is configured
    assert resolve_tracing_config(configured, {EDGE_TRACES_FILE_ENV: " "}) is configured
    relative = os.path.relpath(tmp_path / "t.jsonl")
    resolved = resolve_tracing_config(configured, {EDGE_TRACES_FILE_ENV: relative})
    assert resolved.exporter == "jsonl"
    assert resolved.path == str((tmp_path / "t.jsonl").resolve())  # absolute for Ray workers
    assert resolved.service_name == "edge"


def test_tracing_config_rejects_incomplete_exporters(monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(ValidationError, match="needs tracing.path"):
        TracingConfig(exporter="jsonl")
    with pytest.raises(ValidationError, match="needs tracing.otlp_endpoint"):
        TracingConfig(exporter="otlp")
    with pytest.raises(ValidationError, match="extra"):
        TracingConfig.model_validate({"exporter": "none", "endpoint": "x"})
    monkeypatch.setattr(config_module, "module_available", lambda name: False)
    with pytest.raises(ValidationError, match=r"opentelemetry-exporter-otlp-proto-http==1\.45\.2"):
        TracingConfig(exporter="otlp", otlp_endpoint="http://collector:4318/v1/traces")


def test_the_otlp_exporter_is_imported_only_when_chosen():
    """In a fresh interpreter: building the tracing of a jsonl/none config leaves the OTLP
    package unimported (a router without the otel extra never needs it); otlp imports it."""
    module_name = OTLP_EXPORTER_MODULES["http"]
    script = textwrap.dedent(
        f"""
        import sys
        from deployments.observability.config import TracingConfig
        from deployments.observability.tracing import build_tracer_provider
        build_tracer_provider(TracingConfig(exporter="console"), "router").shutdown()
        print({module_name!r} in sys.modules)
        config = TracingConfig(exporter="otlp", otlp_endpoint="http://127.0.0.1:9/v1/traces")
        build_tracer_provider(config, "router")
        print({module_name!r} in sys.modules)
        """
    )
    assert config_module.module_available(module_name), "the otel extra: `make install-dev`"
    result = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["False", "True"]


def test_exporter_none_exports_nothing_and_records_no_span_but_keeps_trace_ids():
    assert span_exporter(TracingConfig()) is None
    tracer = build_tracer_provider(TracingConfig(), "router").get_tracer("test")
    incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    parent = extract_context({"traceparent": incoming})
    span = tracer.start_span("POST /v1/chat/completions", context=parent)
    assert not span.is_recording()
    assert f"{span.get_span_context().trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    root = tracer.start_span("GET /v1/models")
    assert not root.is_recording() and HEX32.match(f"{root.get_span_context().trace_id:032x}")
    assert root.get_span_context().trace_id != 0


# ---- metrics -------------------------------------------------------------------------------------


def outcome(**overrides: Any) -> RequestOutcome:
    fields: dict[str, Any] = {
        "endpoint": "/v1/chat/completions",
        "model": "glm",
        "status": 200,
        "latency_s": 0.5,
        "stream": True,
        "colo": "LHR",
        "region": "eu",
        "route_reason": "failover",
        "tried": ("FRA", "us", "eu"),
        "skipped_colos": ("FRA",),
        "failed_regions": ("us",),
        "cold_start_ms": 2400.0,
        "cache": None,
        "ttft_s": 0.2,
        "input_tokens": 11,
        "output_tokens": 40,
        "finish_reason": "stop",
    }
    return RequestOutcome(**{**fields, **overrides})


def test_router_metrics_are_tagged_by_model_colo_and_region():
    backend = InMemoryMetricsBackend()
    metrics = RouterMetrics(backend, SERVED)
    metrics.record(outcome())

    at_lhr = {"model": "glm", "colo": "LHR", "region": "eu"}
    assert backend.values("edge_requests_total", **at_lhr, status="200") == [1]
    assert backend.values("edge_request_duration_seconds", **at_lhr) == [0.5]
    assert backend.values("edge_time_to_first_token_seconds", **at_lhr) == [pytest.approx(0.2)]
    assert backend.total("edge_output_tokens_total", **at_lhr) == 40
    assert backend.values("edge_output_tokens_per_second", **at_lhr) == [80.0]
    assert backend.values("edge_cold_starts_total", **at_lhr) == [1]
    assert backend.values("edge_cold_start_duration_seconds", **at_lhr) == [2.4]
    assert backend.values("edge_last_cold_start_seconds", **at_lhr) == [2.4]
    # Each failed attempt counts one failover: FRA's drill (no region reached), then region us
    # (entered by LHR); eu answered and counts none.
    assert backend.values("edge_failovers_total", model="glm", colo="FRA", region="none") == [1]
    assert backend.values("edge_failovers_total", model="glm", colo="LHR", region="us") == [1]
    assert backend.values("edge_failovers_total", region="eu") == []
    assert backend.values("edge_cache_lookups_total") == []
    assert backend.values("edge_rate_limited_total") == []


def test_router_metrics_bound_every_label():
    backend = InMemoryMetricsBackend()
    metrics = RouterMetrics(backend, SERVED)
    metrics.record(
        outcome(
            model="gpt-5-i-made-this-up",
            status=404,
            colo=None,
            route_reason=None,
            tried=(),
            skipped_colos=(),
            failed_regions=(),
            cold_start_ms=None,
            ttft_s=None,
            output_tokens=None,
        )
    )
    metrics.record(
        outcome(
            model=None,
            status=429,
            colo=None,
            route_reason=None,
            tried=(),
            skipped_colos=(),
            failed_regions=(),
            cold_start_ms=None,
            ttft_s=None,
            output_tokens=0,
        )
    )
    metrics.record(
        outcome(
            model="embedding",
            cache="HIT",
            stream=False,
            route_reason="nearest",
            tried=("eu",),
            skipped_colos=(),
            failed_regions=(),
            cold_start_ms=None,
            output_tokens=None,
        )
    )

    assert backend.values("edge_requests_total", model="unknown", colo="none", status="404") == [1]
    assert backend.values("edge_requests_total", model="none", colo="none", status="429") == [1]
    assert backend.values("edge_rate_limited_total", model="none", colo="none") == [1]
    assert backend.values("edge_cache_lookups_total", model="embedding", result="hit") == [1]
    assert (
        backend.values("edge_time_to_first_token_seconds", model="embedding") == []
    )  # only streams have a TTFT
    # 0 tokens: no increment (Ray's counters raise on 0, so does the fake).
    assert backend.values("edge_output_tokens_total") == []
    assert backend.values("edge_failovers_total") == []  # none of these failed over
    labels = {
        value
        for metric in backend.metrics.values()
        for _, tags in metric.points
        for key, value in tags.items()
        if key == "model"
    }
    assert labels <= {*SERVED, "unknown", "none"}


def test_moderation_flags_are_counted_per_category():
    backend = InMemoryMetricsBackend()
    RouterMetrics(backend, SERVED).record(
        outcome(model="moderation", flagged_categories=("profanity", "profanity"), stream=False)
    )
    assert (
        backend.total("edge_moderation_flags_total", model="moderation", category="profanity") == 2
    )


def test_the_fake_backend_checks_tags_like_ray():
    backend = InMemoryMetricsBackend()
    counter = backend.counter("edge_x_total", "x", ("model",))
    with pytest.raises(ValueError, match="missing"):
        counter.inc(1, {})
    with pytest.raises(ValueError, match="unknown"):
        counter.inc(1, {"model": "glm", "colour": "red"})
    with pytest.raises(ValueError, match=">0"):
        counter.inc(0, {"model": "glm"})
    with pytest.raises(ValueError, match="tuple without"):
        backend.counter("edge_y_total", "y", ("deployment",))
    with pytest.raises(ValueError, match="ascending"):
        backend.histogram("edge_h", "h", [10, 5], ("model",))


def test_ray_serve_metrics_accept_our_definitions_outside_ray():
    """ray.serve.metrics record nothing and raise nothing without a Ray worker (Ray 2.60), yet
    check tags: the real classes accept every name, bucket list and tag set we define."""
    backend = RayServeMetricsBackend()
    RouterMetrics(backend, SERVED).record(outcome(cache="MISS", flagged_categories=("profanity",)))
    timings = InferenceTimings(FakeClock())
    timings.prefilled(0.01, 2)
    timings.decoded(0.01, 2)
    ModelMetrics(backend, "glm", "chat").record(timings)
    import ray

    assert not ray.is_initialized()


def test_metric_names_follow_prometheus_conventions_and_are_documented():
    readme = (REPO / "docs" / "observability.md").read_text()
    for name, spec in {**ROUTER_METRICS, **MODEL_METRICS}.items():
        assert name.startswith(("edge_", "gen_ai_"))
        assert (spec.kind == "counter") == name.endswith("_total")
        # Base units: durations in seconds, never milliseconds.
        assert "_ms" not in name and "latency" not in name, name
        if "duration" in name or "time" in name or "wait" in name:
            assert name.endswith("_seconds"), name
        exported = f"ray_{name}" if spec.kind != "histogram" else f"ray_{name}_bucket"
        assert exported in readme, exported


def test_inference_timings_from_a_fake_clock():
    clock = FakeClock(10.0)
    timings = InferenceTimings(clock)
    assert timings.queue_wait_s is None and timings.attributes() == {}
    clock.advance(0.5)
    timings.forwarded(started_at=clock(), seconds=0.25, batch_size=32)
    assert timings.queue_wait_s == pytest.approx(0.5)
    assert timings.time_to_first_output_s == pytest.approx(0.75)
    assert timings.time_per_output_token_s is None
    assert timings.attributes()[attrs.EDGE_MODEL_FORWARD_MS] == 250.0
    assert timings.attributes()[attrs.EDGE_MODEL_BATCH_SIZE] == 32

    chat = InferenceTimings(clock)
    clock.advance(0.3)  # queued, then a 0.1 s prefill that ends now
    chat.prefilled(0.1, batch_size=2)
    assert chat.queue_wait_s == pytest.approx(0.2)
    assert chat.time_to_first_output_s == pytest.approx(0.3)
    for batch_size in (3, 1):
        chat.decoded(0.05, batch_size)
    assert chat.time_per_output_token_s == pytest.approx(0.05)
    assert chat.max_batch_size == 3


# ---- access log ------------------------------------------------------------------------------


def finished_chat(tracing: Tracing, **config: Any) -> dict[str, Any]:
    stream = io.StringIO()
    clock = FakeClock()
    router = make_router(tracing, log_stream=stream, clock=clock, **config)
    headers = {"Authorization": f"Bearer {API_KEY}", "x-request-id": "req-1"}
    telemetry = router.begin(method="POST", path="/v1/chat/completions", headers=headers)
    telemetry.request(
        task="chat", model="glm", prompt=[{"role": "user", "content": PROMPT}], stream=True
    )
    clock.advance(0.1)
    telemetry.first_token()
    clock.advance(0.2)
    telemetry.routed(FakeRoute(reason="nearest", tried=["LHR"], cold_start_ms=None))
    telemetry.usage(input_tokens=9, output_tokens=3, finish_reason="stop")
    telemetry.finish(200)
    assert telemetry.finish(500) is telemetry.outcome  # once only
    (line,) = stream.getvalue().splitlines()
    return {"line": line, "record": json.loads(line), "trace_id": telemetry.trace_id}


def test_requests_finished_in_one_turn_of_the_loop_are_recorded_at_the_next(tracing: Tracing):
    stream = io.StringIO()
    backend = InMemoryMetricsBackend()
    router = make_router(tracing, backend=backend, log_stream=stream)

    def finish_one() -> None:
        router.begin(method="GET", path="/v1/models", headers={}).finish(200)

    def recorded() -> tuple[float, int]:
        return backend.total("edge_requests_total"), len(stream.getvalue().splitlines())

    async def a_turn_of_answers() -> list[tuple[float, int]]:
        seen = []
        for _ in range(3):
            finish_one()
            seen.append(recorded())  # none yet: the answers of this turn go out first
        await asyncio.sleep(0)
        seen.append(recorded())
        return seen

    assert asyncio.run(a_turn_of_answers()) == [(0, 0), (0, 0), (0, 0), (3, 3)]
    finish_one()  # outside an event loop: at once
    assert recorded() == (4, 4)

    async def finished_as_its_loop_stops() -> None:
        finish_one()
        asyncio.get_running_loop().stop()  # the loop ends before its next turn: no flush

    loop = asyncio.new_event_loop()
    loop.run_until_complete(finished_as_its_loop_stops())
    loop.close()
    assert recorded() == (4, 4)

    async def the_next_request() -> None:
        finish_one()

    asyncio.run(the_next_request())  # on a loop of its own: the one left behind comes too
    assert recorded() == (6, 6)


def test_the_access_log_has_the_request_but_no_prompt_or_key_by_default(tracing: Tracing):
    result = finished_chat(tracing)
    line, record = result["line"], result["record"]
    assert PROMPT not in line and "launch code" not in line
    assert API_KEY not in line
    assert "prompt" not in record
    assert record["key_id"] == api_key_id(f"Bearer {API_KEY}") != api_key_id("Bearer other")
    assert record["request_id"] == "req-1"
    assert record["trace_id"] == result["trace_id"]
    assert record["model"] == "glm" and record["colo"] == "LHR" and record["status"] == 200
    assert record["latency_ms"] == pytest.approx(300.0)
    assert record["ttft_ms"] == pytest.approx(100.0)
    assert (record["input_tokens"], record["output_tokens"]) == (9, 3)
    assert record["cold_start"] is False and record["failover"] is False
    assert record["ts"] == 1_700_000_000.0


def test_the_access_log_has_the_prompt_when_enabled(tracing: Tracing):
    record = finished_chat(tracing, log_prompts=True)["record"]
    assert record["prompt"] == [{"role": "user", "content": PROMPT}]
    assert API_KEY not in json.dumps(record)


def test_the_access_log_file_takes_lines_from_many_writers(tmp_path: Path):
    path = tmp_path / "access.jsonl"
    logger = configure_access_logger(path=path)
    logger = configure_access_logger(path=path)  # reconfiguring replaces, never duplicates
    log = AccessLog(logger, wall_clock=lambda: 5.0)
    for status in (200, 503):
        log.write(outcome(status=status), request_id=None, key_id=None)
    configure_access_logger(stream=io.StringIO())  # closes the file handler
    statuses = [json.loads(line)["status"] for line in path.read_text().splitlines()]
    assert statuses == [200, 503]


# ---- the middleware on a tiny app ----------------------------------------------------------------


def build_app(router: RouterObservability | None) -> FastAPI:
    app = FastAPI()
    install_error_handler(app, ErrorShapes({}))
    app.add_middleware(TelemetryMiddleware, observability=router)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        body = await request.json()
        telemetry = request_telemetry(request)
        telemetry.request(task="embedding", model=body["model"], prompt=body["input"])
        if body["model"] not in SERVED:
            raise ModelNotFoundError(f"no model {body['model']!r}", param="model")
        telemetry.routed(
            FakeRoute(reason="nearest", tried=["CDG"], colo="CDG", cache="MISS", cold_start_ms=None)
        )
        telemetry.usage(input_tokens=4)
        return {"traceparent": telemetry.traceparent}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        telemetry = request_telemetry(request)
        telemetry.request(task="chat", model="kimi", stream=True)
        telemetry.routed(FakeRoute(colo="SIN", reason="nearest", tried=["SIN"]))

        async def events() -> Any:
            yield "data: first\n\n"
            telemetry.failed(InternalServerError("generation failed"))  # an error event
            yield "data: error\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_the_middleware_finishes_every_request_with_its_status(tracing: Tracing):
    backend = InMemoryMetricsBackend()
    log = io.StringIO()
    router = make_router(tracing, backend, log)
    with TestClient(build_app(router)) as client:
        assert client.get("/healthz").status_code == 200  # a probe: untraced
        headers = {"traceparent": f"00-{INCOMING_TRACE}-{INCOMING_SPAN}-01"}
        ok = client.post(
            "/v1/embeddings", json={"model": "embedding", "input": PROMPT}, headers=headers
        )
        assert ok.status_code == 200
        assert ok.json()["traceparent"].startswith(f"00-{INCOMING_TRACE}-")
        missing = client.post("/v1/embeddings", json={"model": "nope", "input": "x"})
        assert missing.status_code == 404
        streamed = client.post("/v1/chat/completions", json={})
        assert streamed.status_code == 200 and "error" in streamed.text

    assert backend.values("edge_requests_total", model="embedding", colo="CDG", status="200") == [1]
    assert backend.values("edge_cache_lookups_total", model="embedding", result="miss") == [1]
    assert backend.values("edge_requests_total", model="unknown", colo="none", status="404") == [1]
    # The stream's HTTP status was 200, but it failed: metrics and log say 500.
    assert backend.values("edge_requests_total", model="kimi", colo="SIN", status="500") == [1]
    assert len(backend.values("edge_time_to_first_token_seconds", model="kimi")) == 1
    records = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [r["status"] for r in records] == [200, 404, 500]
    assert records[2]["error_type"] == "InternalServerError"
    assert PROMPT not in log.getvalue()

    spans = tracing.spans()
    assert [s.name for s in spans] == [
        "POST /v1/embeddings",
        "POST /v1/embeddings",
        "POST /v1/chat/completions",
    ]
    assert format_trace_id(spans[0].context.trace_id) == INCOMING_TRACE
    assert spans[1].status.status_code == StatusCode.UNSET  # a 404 is the client's error
    assert spans[1].attributes[attrs.ERROR_TYPE] == "404"
    assert spans[2].status.status_code == StatusCode.ERROR
    assert spans[2].attributes[attrs.HTTP_RESPONSE_STATUS_CODE] == 500


def test_without_the_middleware_endpoints_get_a_disabled_telemetry(tracing: Tracing):
    with TestClient(build_app(None)) as client:
        assert client.post("/v1/embeddings", json={"model": "glm", "input": "x"}).json() == {
            "traceparent": None
        }
    disabled = RequestTelemetry.disabled()
    disabled.request(task="chat", model="glm")
    assert disabled.finish(200) is None and disabled.trace_id is None
    assert tracing.spans() == []


def test_the_authenticated_key_id_replaces_the_header_fingerprint(tracing: Tracing):
    stream = io.StringIO()
    router = make_router(tracing, log_stream=stream)
    headers = {"authorization": f"Bearer {API_KEY}"}
    telemetry = router.begin(method="POST", path="/v1/embeddings", headers=headers)
    assert telemetry.key_id is not None and telemetry.key_id.startswith("key-")
    telemetry.authenticated("team-search")
    telemetry.finish(200)
    assert json.loads(stream.getvalue())["key_id"] == "team-search"


def test_an_answer_that_reached_a_model_tells_the_routers_own_time(tracing: Tracing):
    """x-edge-overhead-ms: the router's time less the model call, when the response starts;
    recorded as edge_overhead_seconds. An answer that reached no model carries none."""
    backend, clock = InMemoryMetricsBackend(), FakeClock()
    app = FastAPI()
    app.add_middleware(
        TelemetryMiddleware, observability=make_router(tracing, backend, clock=clock)
    )

    @app.post("/v1/embeddings")
    async def embeddings(request: Request) -> dict[str, Any]:
        telemetry = request_telemetry(request)
        telemetry.request(task="embedding", model="embedding")
        clock.advance(0.0004)
        with telemetry.overhead.away():
            clock.advance(0.25)  # the RTT and the replica
        clock.advance(0.0003)
        return {}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        clock.advance(0.001)
        return {}

    with TestClient(app) as client:
        served = client.post("/v1/embeddings", json={})
        listed = client.get("/v1/models")
    assert served.headers["x-edge-overhead-ms"] == "0.700"
    assert "x-edge-overhead-ms" not in listed.headers
    assert backend.values("edge_overhead_seconds", model="embedding") == [pytest.approx(0.0007)]
    assert len(backend.values("edge_overhead_seconds")) == 1
