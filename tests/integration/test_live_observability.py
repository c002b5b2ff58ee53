"""Traces from router to model in one trace, metrics on Ray's Prometheus endpoint, access logs."""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from conftest import TRACES_FILE, USER, wait_until

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def traced_chat(serve_cluster) -> tuple[httpx.Response, str]:
    marker = f"secret-prompt-{uuid.uuid4().hex}"
    response = httpx.post(
        f"{serve_cluster.base_url}/v1/chat/completions",
        json={"model": "glm", "messages": [{"role": "user", "content": marker}], "max_tokens": 3},
        headers={**USER, "traceparent": f"00-{TRACE_ID}-{PARENT_SPAN}-01"},
        timeout=120,
    )
    assert response.status_code == 200
    return response, marker


def spans_of(trace_id: str) -> list[dict]:
    lines = TRACES_FILE.read_text().splitlines() if TRACES_FILE.exists() else []
    return [span for span in map(json.loads, lines) if span["trace_id"] == trace_id]


def test_router_and_model_spans_share_one_trace_with_genai_attributes(traced_chat):
    spans = wait_until(
        lambda: (found := spans_of(TRACE_ID)) and len(found) >= 2 and found,
        30,
        "a router span and a model span in the traces file",
    )
    by_parent = {span["parent_span_id"]: span for span in spans}
    router = by_parent[PARENT_SPAN]  # the incoming traceparent was continued
    model = by_parent[router["span_id"]]  # the model span is the router span's child
    assert router["attributes"]["gen_ai.request.model"] == "glm"
    assert router["attributes"]["edge.colo"]
    assert model["attributes"]["gen_ai.request.model"] == "glm"
    assert model["attributes"]["gen_ai.usage.output_tokens"] >= 1
    assert model["attributes"]["gen_ai.usage.input_tokens"] >= 1
    assert model["attributes"]["gen_ai.response.finish_reasons"]


def test_metrics_endpoint_exposes_the_named_metrics(traced_chat, serve_cluster):
    def exported() -> list[str] | None:
        text = httpx.get(serve_cluster.metrics_url, timeout=10).text
        lines = [
            line for line in text.splitlines() if line.startswith(("ray_edge_", "ray_gen_ai_"))
        ]
        glm = [line for line in lines if 'model="glm"' in line]
        return lines if any(line.startswith("ray_edge_requests_total") for line in glm) else None

    lines = wait_until(exported, 90, "glm's request count on the Prometheus endpoint", every_s=2)
    names = {line.split("{")[0] for line in lines}
    assert {
        "ray_edge_requests_total",
        "ray_edge_request_duration_seconds_bucket",
        "ray_edge_key_requests_total",
        "ray_gen_ai_server_request_duration_seconds_bucket",
        "ray_gen_ai_client_token_usage_bucket",
    } <= names
    assert not any("_ms" in name for name in names), names  # base units only
    requests = [line for line in lines if line.startswith("ray_edge_requests_total")]
    # The shared cluster has no regions: one pool per model, region "default" (a real label).
    assert any('colo="' in line and 'region="default"' in line for line in requests), requests


def test_access_log_has_the_request_but_no_prompt_text(traced_chat):
    response, marker = traced_chat
    log_file = TRACES_FILE.with_suffix(".access.log")
    lines = wait_until(
        lambda: log_file.exists() and log_file.read_text().splitlines(), 30, "access log lines"
    )
    records = [json.loads(line) for line in lines]
    ours = [r for r in records if r.get("request_id") == response.headers["x-request-id"]]
    assert ours and ours[0]["model"] == "glm" and ours[0]["status"] == 200
    assert ours[0]["key_id"] == "user"  # the key's id, never the key
    assert marker not in log_file.read_text()
    assert "sk-user" not in log_file.read_text()
