"""Metrics in Prometheus conventions: the GenAI semantic-convention metrics, route reasons,
cold-start phases, usage and cost per key, and the price table's validation."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

from deployments.config import ConfigError, parse_app_config
from deployments.observability.access_log import configure_access_logger
from deployments.observability.config import ModelPrice, ObservabilityConfig
from deployments.observability.metrics import RouterMetrics
from deployments.observability.metrics_backend import InMemoryMetricsBackend
from deployments.observability.outcome import RequestOutcome
from deployments.observability.router_telemetry import RouterObservability

SERVED = ("glm", "kimi", "embedding", "moderation")
PRICES = {"glm": ModelPrice(per_request=1.0, per_million_input_tokens=100.0,
                            per_million_output_tokens=400.0)}  # fmt: skip


def outcome(**overrides: Any) -> RequestOutcome:
    fields: dict[str, Any] = {
        "endpoint": "/v1/chat/completions",
        "model": "glm",
        "status": 200,
        "latency_s": 0.5,
        "stream": True,
        "colo": "LHR",
        "route_reason": "nearest",
        "tried": ("LHR",),
        "ttft_s": 0.2,
        "input_tokens": 1000,
        "output_tokens": 500,
        "operation": "chat",
        "key_id": "alice",
    }
    return RequestOutcome(**{**fields, **overrides})


def metrics() -> tuple[InMemoryMetricsBackend, RouterMetrics]:
    backend = InMemoryMetricsBackend()
    return backend, RouterMetrics(backend, SERVED, PRICES)


GLM_CHAT = {"gen_ai_operation_name": "chat", "gen_ai_request_model": "glm"}


def test_gen_ai_semantic_convention_metrics_in_prometheus_form():
    backend, router = metrics()
    router.record(outcome())
    router.record(outcome(stream=False, ttft_s=None, latency_s=1.5))
    router.record(outcome(status=404, model="nope", input_tokens=None, output_tokens=None))
    router.record(outcome(status=503, error_type="OverloadedError", output_tokens=None))
    router.record(outcome(status=500, error_type="KeyError", output_tokens=None))

    duration = "gen_ai_server_request_duration_seconds"
    assert backend.values(duration, **GLM_CHAT, error_type="") == [0.5, 1.5]
    assert backend.values(duration, gen_ai_request_model="unknown", error_type="404") == [0.5]
    assert backend.values(duration, **GLM_CHAT, error_type="OverloadedError") == [0.5]
    # A crash's class name is not a bounded label: its status stands for it.
    assert backend.values(duration, **GLM_CHAT, error_type="500") == [0.5]
    # TTFT of successful streams only.
    assert backend.values("gen_ai_server_time_to_first_token_seconds", **GLM_CHAT) == [0.2]
    usage = "gen_ai_client_token_usage"
    assert backend.values(usage, **GLM_CHAT, gen_ai_token_type="input") == [1000] * 4
    assert backend.values(usage, **GLM_CHAT, gen_ai_token_type="output") == [500, 500]


def test_requests_of_no_model_have_no_gen_ai_metrics():
    backend, router = metrics()
    router.record(outcome(endpoint="/v1/models", model=None, operation=None, stream=False))
    assert backend.values("gen_ai_server_request_duration_seconds") == []
    assert backend.values("edge_requests_total", model="none", status="200") == [1]


def test_usage_and_cost_are_counted_per_authenticated_key_and_model():
    backend, router = metrics()
    router.record(outcome())
    router.record(outcome(input_tokens=3000, output_tokens=None, stream=False))
    router.record(outcome(model="kimi", key_id="bob"))  # no price for kimi: no cost
    router.record(outcome(status=429, input_tokens=None, output_tokens=None))
    router.record(outcome(key_id=None))  # never authenticated: no per-key label at all

    alice_glm = {"key_id": "alice", "model": "glm"}
    assert backend.total("edge_key_requests_total", **alice_glm) == 3
    assert backend.total("edge_key_input_tokens_total", **alice_glm) == 4000
    assert backend.total("edge_key_output_tokens_total", **alice_glm) == 500
    # (1 + 1000 * 100/1e6 + 500 * 400/1e6) + (1 + 3000 * 100/1e6); the 429 costs nothing.
    assert backend.total("edge_key_cost_units_total", **alice_glm) == pytest.approx(2.6)
    assert backend.total("edge_key_requests_total", key_id="bob", model="kimi") == 1
    assert backend.values("edge_key_cost_units_total", key_id="bob") == []
    keys = {tags["key_id"] for _, tags in backend.metrics["edge_key_requests_total"].points}
    assert keys == {"alice", "bob"}


def test_route_reasons_are_counted_and_bounded():
    backend, router = metrics()
    for reason in ("nearest", "warm", "warm", "spillover", "made-up"):
        router.record(outcome(route_reason=reason))
    router.record(outcome(route_reason=None, colo=None, status=400))  # never routed

    def count(reason: str) -> float:
        return backend.total("edge_route_decisions_total", model="glm", reason=reason)

    assert [count(r) for r in ("nearest", "warm", "spillover", "other")] == [1, 2, 1, 1]
    assert backend.total("edge_route_decisions_total") == 5


@dataclass
class ColdRoute:
    colo: str = "SIN"
    region: str = "ap"
    rtt_ms: float = 3.0
    reason: str = "nearest"
    tried: list[str] = field(default_factory=lambda: ["ap"])
    skipped_colos: tuple[str, ...] = ()
    failed_regions: tuple[str, ...] = ()
    cold_start_ms: float | None = 2500.0
    cache: str | None = None
    cold_start_phases: dict[str, float | None] | None = field(
        default_factory=lambda: {
            "process_s": None,
            "model_load_s": 1.25,
            "warmup_s": 0.25,
            "init_s": 1.5,
        }
    )


def test_a_request_through_the_router_telemetry_records_phases_key_usage_and_cost():
    backend = InMemoryMetricsBackend()
    config = ObservabilityConfig(prices=PRICES)
    clock_now = [0.0]
    observability = RouterObservability(
        config,
        SERVED,
        tracer=TracerProvider().get_tracer("test"),
        metrics_backend=backend,
        access_logger=configure_access_logger(stream=io.StringIO()),
        clock=lambda: clock_now[0],
    )
    telemetry = observability.begin(method="POST", path="/v1/chat/completions", headers={})
    telemetry.authenticated("alice")
    telemetry.request(task="chat", model="glm")
    telemetry.routed(ColdRoute())
    telemetry.usage(input_tokens=10, output_tokens=20, finish_reason="stop")
    clock_now[0] = 3.0
    telemetry.finish(200)

    phase = "edge_cold_start_phase_seconds"
    assert backend.values(phase, model="glm", phase="model_load") == [1.25]
    assert backend.values(phase, model="glm", phase="warmup") == [0.25]
    assert backend.values(phase, model="glm", phase="init") == [1.5]
    assert backend.values(phase, phase="process") == []  # unknown outside Ray: left out
    assert backend.values("edge_cold_start_duration_seconds", colo="SIN") == [2.5]
    assert backend.values("gen_ai_server_request_duration_seconds", **GLM_CHAT) == [3.0]
    assert backend.total("edge_key_cost_units_total", key_id="alice") == pytest.approx(1.009)


def test_the_price_table_is_validated_against_the_served_models():
    base: dict[str, Any] = {"models": {"glm": {"task": "chat", "family": "glm", "model_dir": "g"}}}
    ok = parse_app_config({**base, "observability": {"prices": {"glm": {"per_request": 2}}}})
    assert ok.observability.prices["glm"].cost(0, 0) == 2
    with pytest.raises(ConfigError, match=r"observability.prices: \['gpt'\] are not served"):
        parse_app_config({**base, "observability": {"prices": {"gpt": {"per_request": 1}}}})
    with pytest.raises(ConfigError, match=r"prices\.glm\.per_million_input_tokens"):
        parse_app_config(
            {**base, "observability": {"prices": {"glm": {"per_million_input_tokens": -1}}}}
        )
    with pytest.raises(ConfigError, match=r"prices\.glm\.per_token"):
        parse_app_config({**base, "observability": {"prices": {"glm": {"per_token": 1}}}})
