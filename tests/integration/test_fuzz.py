"""Schemathesis against the live router's own /openapi.json: no client input gets a 5xx, and
the server still answers afterwards. (Cases come from schemathesis' strategies and run under
hypothesis directly: its pytest plugin does not load with pytest 9.)"""

from __future__ import annotations

import httpx
import schemathesis
from conftest import LOAD, USER
from hypothesis import HealthCheck, given, settings

MAX_EXAMPLES = 25  # per operation: bounded, so CI stays fast
# Probes read the cluster state (slow, not input-driven); the admin API is not in the schema.
SKIPPED = {"/healthz", "/readyz"}


def test_no_client_input_gets_a_server_error(serve_cluster):
    schema = schemathesis.openapi.from_url(f"{serve_cluster.base_url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    fuzzed = [op for op in operations if op.path not in SKIPPED]
    assert {"/v1/chat/completions", "/v1/embeddings", "/v1/moderations"} <= {
        op.path for op in fuzzed
    }
    for operation in fuzzed:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        def no_server_error(case) -> None:
            headers = {**(case.headers or {}), **LOAD, "x-edge-cache": "bypass"}
            response = case.call(base_url=serve_cluster.base_url, headers=headers, timeout=120)
            where = f"{case.method} {case.formatted_path}"
            assert response.status_code < 500, f"{where}: {response.text[:500]}"
            if response.status_code >= 400 and "json" in response.headers.get("content-type", ""):
                body = response.json()
                assert "error" in body or body.get("success") is False, where

        no_server_error()


def test_still_serving_after_the_fuzz(serve_cluster):
    response = httpx.post(
        f"{serve_cluster.base_url}/v1/moderations", json={"input": "still here"}, headers=USER
    )
    assert response.status_code == 200
