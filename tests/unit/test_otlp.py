"""OpenTelemetry's standard environment variables over the config file, and the OTLP/HTTP path
end to end: a real exporter posting to a real HTTP receiver that decodes the protobuf request
with opentelemetry-proto. The model span comes from another process configured only by OTEL_*."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON

from deployments.observability.access_log import configure_access_logger
from deployments.observability.config import ObservabilityConfig, TracingConfig
from deployments.observability.environment import (
    parse_resource_attributes,
    resolve_tracing_config,
)
from deployments.observability.metrics_backend import InMemoryMetricsBackend
from deployments.observability.router_telemetry import RouterObservability
from deployments.observability.tracing import build_tracer_provider, sampler_of

REPO = Path(__file__).resolve().parents[2]
INCOMING_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INCOMING_PARENT = "00f067aa0ba902b7"


class OtlpReceiver:
    """An OTLP/HTTP traces endpoint: every POST body decoded as ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        self.content_types: list[str] = []
        self._arrived = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)
                with receiver._arrived:
                    receiver.requests.append(request)
                    receiver.paths.append(self.path)
                    receiver.content_types.append(self.headers["Content-Type"])
                    receiver._arrived.notify_all()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list[tuple[dict[str, str], object]]:
        """(resource attributes, span) for every span received so far."""
        found = []
        for request in self.requests:
            for resource_spans in request.resource_spans:
                resource = {
                    kv.key: kv.value.string_value or str(kv.value.int_value)
                    for kv in resource_spans.resource.attributes
                }
                for scope_spans in resource_spans.scope_spans:
                    found.extend((resource, span) for span in scope_spans.spans)
        return found

    def wait_for_spans(self, count: int, timeout_s: float) -> list[tuple[dict[str, str], object]]:
        with self._arrived:
            self._arrived.wait_for(lambda: len(self.spans()) >= count, timeout_s)
            return self.spans()


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    yield receiver
    receiver.server.shutdown()
    receiver.server.server_close()


MODEL_PROCESS = """
import sys
from deployments.observability import ModelObservability, ObservabilityConfig

# Configured by the OTEL_* environment only, as a model replica started by `serve run`.
model = ModelObservability(ObservabilityConfig(metrics=False), "glm", "chat")
with model.call(sys.argv[1], max_tokens=4) as call:
    call.usage(input_tokens=3, output_tokens=2, finish_reason="stop")
# The provider's exit hook flushes the batch exporter.
"""


def test_router_and_model_spans_reach_a_real_otlp_receiver_in_one_trace(receiver: OtlpReceiver):
    environ = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "edge-under-test",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci,team=edge%20ops",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
    }
    # The config file says otherwise; the standard variables win.
    from_file = TracingConfig(exporter="none", service_name="from-the-file", sample_ratio=0.0)
    config = resolve_tracing_config(from_file, environ)
    assert config.exporter == "otlp"
    assert config.otlp_endpoint == receiver.endpoint + "/v1/traces"

    provider = build_tracer_provider(config, "router")
    router = RouterObservability(
        ObservabilityConfig(tracing=config),
        ["glm"],
        tracer=provider.get_tracer("test"),
        metrics_backend=InMemoryMetricsBackend(),
        access_logger=configure_access_logger(stream=io.StringIO()),
    )
    telemetry = router.begin(
        method="POST",
        path="/v1/chat/completions",
        headers={"traceparent": f"00-{INCOMING_TRACE}-{INCOMING_PARENT}-01"},
    )
    telemetry.request(task="chat", model="glm")
    child_env = {**os.environ, **environ, "PYTHONPATH": str(REPO)}
    child_env.pop("EDGE_TRACES_FILE", None)
    subprocess.run(
        [sys.executable, "-c", MODEL_PROCESS, telemetry.traceparent or ""],
        env=child_env,
        check=True,
        timeout=60,
    )
    telemetry.finish(200)
    provider.force_flush()

    received = receiver.wait_for_spans(2, timeout_s=30)
    by_role = {resource["edge.process_role"]: (resource, span) for resource, span in received}
    assert set(by_role) == {"router", "model:glm"}
    (router_resource, router_span), (model_resource, model_span) = (
        by_role["router"],
        by_role["model:glm"],
    )
    assert router_span.trace_id.hex() == model_span.trace_id.hex() == INCOMING_TRACE
    assert router_span.parent_span_id.hex() == INCOMING_PARENT
    assert model_span.parent_span_id == router_span.span_id
    for resource in (router_resource, model_resource):
        assert resource["service.name"] == "edge-under-test"
        assert resource["deployment.environment"] == "ci"
        assert resource["team"] == "edge ops"
    assert router_resource["process.pid"] != model_resource["process.pid"]
    attributes = {kv.key: kv.value for kv in model_span.attributes}
    assert attributes["gen_ai.request.model"].string_value == "glm"
    assert attributes["gen_ai.usage.output_tokens"].int_value == 2
    assert set(receiver.paths) == {"/v1/traces"}
    assert set(receiver.content_types) == {"application/x-protobuf"}
    provider.shutdown()


def test_otlp_endpoints_follow_the_exporter_specification():
    base = TracingConfig()
    http = resolve_tracing_config(base, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"})
    assert (http.exporter, http.otlp_endpoint) == ("otlp", "http://c:4318/v1/traces")
    traces = resolve_tracing_config(
        base,
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:9999/custom",
        },
    )
    assert traces.otlp_endpoint == "http://t:9999/custom"  # the signal's own one, as is
    off = resolve_tracing_config(
        base, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}
    )
    assert off.exporter == "none"
    console = resolve_tracing_config(base, {"OTEL_TRACES_EXPORTER": "console"})
    assert console.exporter == "console"


def test_edge_traces_file_wins_over_otel_variables(tmp_path: Path):
    resolved = resolve_tracing_config(
        TracingConfig(),
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
            "OTEL_SERVICE_NAME": "svc",
            "EDGE_TRACES_FILE": str(tmp_path / "t.jsonl"),
        },
    )
    assert (resolved.exporter, resolved.path) == ("jsonl", str(tmp_path / "t.jsonl"))
    assert resolved.service_name == "svc"


def test_service_name_from_resource_attributes_when_otel_service_name_is_unset():
    resolved = resolve_tracing_config(
        TracingConfig(service_name="file", resource_attributes={"region": "eu"}),
        {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,tier=edge"},
    )
    assert resolved.service_name == "from-attrs"
    assert resolved.resource_attributes == {
        "region": "eu",
        "service.name": "from-attrs",
        "tier": "edge",
    }
    assert parse_resource_attributes("a=1,, b = x%2Cy ") == {"a": "1", "b": "x,y"}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin'"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER='sometimes'"),
        ({"OTEL_TRACES_SAMPLER_ARG": "1.5"}, "a ratio from 0 to 1"),
        ({"OTEL_TRACES_SAMPLER_ARG": "half"}, "a ratio from 0 to 1"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "novalue"}, "'novalue' is not key=value"),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, "needs tracing.otlp_endpoint"),
    ],
)
def test_bad_otel_variables_are_named_in_the_error(environ: dict[str, str], message: str):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        resolve_tracing_config(TracingConfig(), environ)


def test_samplers_by_their_sdk_names():
    def sampled(name: str, ratio: float = 1.0) -> bool:
        config = resolve_tracing_config(
            TracingConfig(),
            {"OTEL_TRACES_SAMPLER": name, "OTEL_TRACES_SAMPLER_ARG": str(ratio)},
        )
        # an exporter to record for: with none, no span is recorded whatever the sampler
        provider = build_tracer_provider(config, "router", InMemorySpanExporter())
        span = provider.get_tracer("t").start_span("s")
        span.end()
        return span.is_recording() or span.get_span_context().trace_flags.sampled

    assert sampled("always_on") and not sampled("always_off")
    assert sampled("traceidratio", 1.0) and not sampled("traceidratio", 0.0)
    assert sampled("parentbased_always_on") and not sampled("parentbased_always_off")
    assert sampler_of(TracingConfig(sampler="always_on")) is ALWAYS_ON
    assert sampler_of(TracingConfig(sampler="always_off")) is ALWAYS_OFF
    assert "ParentBased" in type(sampler_of(TracingConfig())).__name__
