"""The chaos scenario's pure parts: its phases, its per-fault table from records, the stream
split of its workload. The run itself is tests/integration/test_high_availability.py's."""

from __future__ import annotations

from typing import Any

import pytest
from test_loadtest import record

from edgectl.loadtest.chaos import FAULTS, Injection, fault_phases, fault_summary
from edgectl.loadtest.regions import DEFAULT_REGIONS
from edgectl.loadtest.scenarios import Arrival, ModelTarget
from edgectl.loadtest.workload import WorkloadSettings, build_request


def test_each_fault_has_its_window_split_in_three() -> None:
    phases = fault_phases(("gcs", "redis"), 30.0)
    assert [(p.name, p.start_s, p.end_s) for p in phases] == [
        ("gcs:before", 0.0, 10.0),
        ("gcs:during", 10.0, 20.0),
        ("gcs:after", 20.0, 30.0),
        ("redis:before", 30.0, 40.0),
        ("redis:during", 40.0, 50.0),
        ("redis:after", 50.0, 60.0),
    ]


def at(seconds: float, latency_ms: float, **fields: Any):
    return record(int(seconds * 10), latency_ms, scheduled_s=seconds, **fields)


def test_the_per_fault_table_counts_streams_cut_apart_and_times_recovery() -> None:
    records = [
        at(1.0, 100.0),  # gcs: before
        at(12.0, 300.0, stream=False),  # during, ok
        at(13.0, 2000.0, stream=False, ok=False, status=500, error_kind="http"),
        at(14.0, 500.0, ok=False, error_kind="stream"),  # a stream cut by the kill
        at(25.0, 120.0),  # after
        at(35.0, 90.0),  # redis: before; nothing failed in its window
    ]
    injections = [
        Injection("gcs", 10.0, 11.0, "gcs_server pid [1]"),
        Injection("redis", 40.0, 41.0, "redis-server killed and restarted"),
    ]
    table = fault_summary(records, ("gcs", "redis"), injections, 30.0)
    gcs = table["gcs"]
    assert (gcs["sent"], gcs["ok"], gcs["failed"], gcs["streams_cut"]) == (5, 3, 1, 1)
    assert gcs["errors"] == ["http 500", "stream"]
    assert gcs["p99_ms"]["before"] == pytest.approx(100.0)
    assert gcs["p99_ms"]["during"] == pytest.approx(300.0)
    assert gcs["p99_ms"]["after"] == pytest.approx(120.0)
    assert gcs["recovered_s"] == pytest.approx(5.0)  # 13 s + 2 s, from the kill at 10 s
    assert (gcs["failed_in_flight"], gcs["failed_after"]) == (0, 2)
    assert gcs["injected"]["detail"] == "gcs_server pid [1]"
    redis = table["redis"]
    assert (redis["sent"], redis["failed"], redis["recovered_s"]) == (1, 0, 0.0)
    assert redis["p99_ms"]["during"] is None  # nothing sent in that phase


def test_a_request_in_flight_on_the_killed_process_is_told_apart() -> None:
    records = [
        at(9.5, 800.0, stream=False, ok=False, status=500, error_kind="http"),  # sent before
        at(11.0, 100.0),
    ]
    table = fault_summary(
        records, ("router-replica",), [Injection("router-replica", 10.0, 10.1, "")], 30.0
    )
    outcome = table["router-replica"]
    assert (outcome["failed_in_flight"], outcome["failed_after"]) == (1, 0)
    assert outcome["recovered_s"] == pytest.approx(0.3)  # it ended 0.3 s after the kill


def test_a_fault_never_injected_says_so() -> None:
    table = fault_summary([at(1.0, 50.0)], ("head",), [], 30.0)
    assert table["head"]["injected"] is None and table["head"]["recovered_s"] == 0.0
    assert set(FAULTS) >= {"head", "gcs", "redis", "router-replica", "ingress"}


def test_a_share_of_chat_requests_asks_for_whole_answers() -> None:
    chat = ModelTarget(name="glm", task="chat")
    arrivals = [Arrival(i, 0.0, chat, "openai", DEFAULT_REGIONS[0], i * 977) for i in range(400)]
    half = WorkloadSettings(stream_share=0.5)
    streams = [build_request(a, half, "t").stream for a in arrivals]
    assert 120 < sum(streams) < 280  # about half, by the seeded prompt draw
    assert all(build_request(a, WorkloadSettings(), "t").stream for a in arrivals)
    embedding = Arrival(
        0, 0.0, ModelTarget(name="e", task="embedding"), "openai", DEFAULT_REGIONS[0], 0
    )
    assert not build_request(embedding, half, "t").stream
