"""Schemathesis against the live router's own /openapi.json: no client input gets a 5xx, and
the server still answers afterwards."""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from conftest import USER
from hypothesis import HealthCheck, settings

MAX_EXAMPLES = 25  # per operation: bounded, so CI stays fast


@pytest.fixture(scope="module")
def router_schema(serve_cluster):
    schema = schemathesis.openapi.from_url(f"{serve_cluster.base_url}/openapi.json")
    # Probes read the cluster state (slow, not input-driven); the admin API is not in the schema.
    return schema.exclude(path_regex="^/(healthz|readyz)$")


schema = schemathesis.pytest.from_fixture("router_schema")


@schema.parametrize()
@settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_client_input_gets_a_server_error(case, serve_cluster):
    case.headers = {**(case.headers or {}), **USER, "x-edge-cache": "bypass"}
    response = case.call(base_url=serve_cluster.base_url, timeout=120)
    assert response.status_code < 500, f"{case.method} {case.path}: {response.text[:500]}"
    if response.status_code >= 400 and "json" in response.headers.get("content-type", ""):
        body = response.json()
        assert "error" in body or body.get("success") is False


def test_still_serving_after_the_fuzz(serve_cluster):
    response = httpx.post(
        f"{serve_cluster.base_url}/v1/moderations", json={"input": "still here"}, headers=USER
    )
    assert response.status_code == 200
