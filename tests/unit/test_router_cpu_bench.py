"""The router_cpu suite drives the real router app on the shared fake model handles: every
endpoint it measures must answer 200 through today's services (its fakes once fell behind the
chat server's interface and the suite failed on a 500). Its in-process part is its quick form
without a cluster; the replicas' part needs one."""

from __future__ import annotations

from pathlib import Path

from benchmarks.router_cpu.in_process import endpoints
from benchmarks.router_cpu.overhead import edge_overhead_ms
from benchmarks.router_cpu.replicas import cpu_used
from benchmarks.router_cpu.suite import RouterCpuBenchConfig, run_router_cpu_suite


def test_every_measured_endpoint_answers_through_the_real_app() -> None:
    config = RouterCpuBenchConfig(
        models_dir=Path("/models"), in_process_requests=2, in_process_rounds=1, replicas=False
    )
    result = run_router_cpu_suite(config)
    measured = result["in_process"]["endpoints"]
    assert set(measured) == set(endpoints("glm", "embedding"))
    for name, figures in measured.items():
        assert figures["cpu_us_per_request"] > 0, name
    assert measured["embeddings_float"]["response_bytes"] > 384 * 8  # 384 floats as JSON text
    assert result["goals"]["embedding_router_app_cpu_us"]["value"] > 0
    # Not measured, so not judged: no replica goal without the cluster.
    assert "router_cpu_per_embedding_request" not in result["goals"]
    ledger = result["in_process"]["ledger"]
    assert ledger["records_written"] == 2 * (1 + 2)  # per endpoint: its check request + a round
    assert ledger["embeddings_float"]["on_cpu_us"] > 0 and ledger["chat"]["off_cpu_us"] > 0
    assert result["goals"]["ledger_router_cpu_ratio"]["value"] > 0
    for name, encoded in result["in_process"]["encoders"].items():
        assert encoded["fast_bytes"] > 0 and encoded["legacy_bytes"] > 0, name


def test_the_in_process_overhead_is_read_off_every_answer() -> None:
    """Each measured request reached the model (a miss, through the shipped SQLite cache and
    gateway state) and said its x-edge-overhead-ms."""
    measured = edge_overhead_ms(requests=5)
    assert measured["overhead_ms"]["count"] == 5 and measured["overhead_ms"]["p50"] > 0


def test_the_front_s_cpu_survives_an_haproxy_reload_between_two_readings():
    """Serve's HAProxy manager starts a new HAProxy on a reload and the old one exits: the
    routers' and the front's CPU come from the processes of each reading (a CI run's suite
    failed reading the old HAProxy's /proc after it had gone)."""
    before = ({1: 1.0, 2: 3.0}, {10: 5.0, 11: 2.0})  # 11: the HAProxy before the reload
    after = ({1: 1.5, 2: 3.25}, {10: 5.5, 12: 0.25})  # 12: the HAProxy after it
    assert cpu_used(before, after) == (0.75, 0.75)
