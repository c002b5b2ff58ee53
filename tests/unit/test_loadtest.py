"""The load generator without Ray: schedules, SSE reading, records and summary maths, replica
sampling from a recorded Ray dashboard answer, and whole runs against an in-process fake router,
on virtual time (the run's pacing, the router's delays and the timeouts pass at once)."""

from __future__ import annotations

import asyncio
import csv
import json
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from httpx_sse import ServerSentEvent
from virtual_time import VirtualTime

from edge_sim.clock import ManualClock
from edgectl.loadtest.cli import main as loadgen_main
from edgectl.loadtest.progress import NoProgress
from edgectl.loadtest.records import CSV_COLUMNS, EdgeHeaders, RequestRecord, write_csv
from edgectl.loadtest.regions import DEFAULT_REGIONS, region_named
from edgectl.loadtest.replicas import ReplicaSample, ReplicaSampler
from edgectl.loadtest.report import write_outputs
from edgectl.loadtest.responses import StreamTally, body_error_text
from edgectl.loadtest.runner import LoadRunner, RunResult, RunSettings
from edgectl.loadtest.scenarios import (
    Arrival,
    ModelTarget,
    Phase,
    ScenarioConfig,
    Schedule,
    build_schedule,
    poisson_times,
)
from edgectl.loadtest.summary import latency_stats, replica_summary, summarize
from edgectl.loadtest.workload import WorkloadSettings, build_request
from edgectl.local_cluster import wait_until
from edgectl.serve_state import (
    ServeDashboard,
    ServeStatusError,
    parse_serve_applications,
    ray_auth_token,
    scale_to_zero_delays_s,
)

REPO = Path(__file__).resolve().parents[2]
MODELS = (
    ModelTarget(name="glm", task="chat"),
    ModelTarget(name="kimi", task="chat"),
    ModelTarget(name="embedding", task="embedding"),
    ModelTarget(name="moderation", task="moderation"),
)
ADMIN_KEY = "test-admin-key"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# Recorded from Ray 2.60's dashboard (GET /api/serve/applications/); glm is starting a second
# replica, kimi is at zero, moderation is stopping one of two.
SERVE_APPLICATIONS = json.loads(
    (Path(__file__).parent / "data" / "serve_applications.json").read_text()
)


def config(**fields: Any) -> ScenarioConfig:
    return ScenarioConfig.model_validate({"scenario": "steady", "models": MODELS, **fields})


# ---- schedules ----------------------------------------------------------------------------


def test_steady_arrivals_are_poisson_at_the_target_rate() -> None:
    rate, duration = 40.0, 250.0
    schedule = build_schedule(config(rate_rps=rate, duration_s=duration, seed=7))
    times = np.array([a.at_s for a in schedule.arrivals])
    expected = rate * duration  # 10 000; Poisson sd = 100, so 4 % is four standard deviations
    assert abs(len(times) - expected) < 0.04 * expected
    assert np.all(np.diff(times) >= 0) and times.min() >= 0 and times.max() < duration
    gaps = np.diff(times)
    # Exponential gaps: mean 1/rate and coefficient of variation 1 (a fixed-interval sender
    # would have a CV of 0, a bursty one well above 1).
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.04)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.05)
    # Every model and both APIs get traffic, all from the one configured region.
    assert {a.model.name for a in schedule.arrivals} == {m.name for m in MODELS}
    workers_share = np.mean([a.api == "workers" for a in schedule.arrivals])
    assert workers_share == pytest.approx(0.1, abs=0.02)
    assert {a.region.name for a in schedule.arrivals} == {"eu-central"}


def test_schedules_are_reproducible_from_the_seed() -> None:
    def key(schedule: Schedule) -> list[tuple[Any, ...]]:
        return [(a.at_s, a.model.name, a.api, a.region.name, a.prompt) for a in schedule.arrivals]

    first = build_schedule(config(scenario="geo-mix", rate_rps=20, duration_s=20, seed=3))
    again = build_schedule(config(scenario="geo-mix", rate_rps=20, duration_s=20, seed=3))
    other = build_schedule(config(scenario="geo-mix", rate_rps=20, duration_s=20, seed=4))
    assert key(first) == key(again)
    assert key(first) != key(other)


def test_max_requests_keeps_the_first_arrivals() -> None:
    full = build_schedule(config(rate_rps=10, duration_s=30))
    capped = build_schedule(config(rate_rps=10, duration_s=30, max_requests=25))
    assert len(capped.arrivals) == 25
    assert [a.at_s for a in capped.arrivals] == [a.at_s for a in full.arrivals[:25]]


def test_ramp_rate_increases_linearly() -> None:
    rate, duration = 40.0, 400.0
    schedule = build_schedule(config(scenario="ramp", rate_rps=rate, duration_s=duration))
    times = np.array([a.at_s for a in schedule.arrivals])
    quarters = np.histogram(times, bins=4, range=(0, duration))[0]
    assert all(np.diff(quarters) > 0)
    # From rate/10 up to rate: the first quarter averages 0.2125 x rate, the last 0.8875 x rate.
    quarter_s = duration / 4
    assert quarters[0] == pytest.approx(0.2125 * rate * quarter_s, rel=0.08)
    assert quarters[-1] == pytest.approx(0.8875 * rate * quarter_s, rel=0.05)


def test_poisson_thinning_follows_the_rate_function() -> None:
    rng = np.random.default_rng(0)
    times = poisson_times(rng, 10.0, 110.0, 50.0, lambda t: np.where(t < 60.0, 50.0, 0.0))
    assert times.min() >= 10.0 and times.max() < 60.0
    assert len(times) == pytest.approx(50 * 50, rel=0.08)
    assert poisson_times(rng, 5.0, 5.0, 10.0).size == 0


def test_burst_after_idle_primes_each_model_then_stays_silent() -> None:
    schedule = build_schedule(
        config(
            scenario="burst-after-idle", rate_rps=20, duration_s=10, warm_s=2, idle_s=300, seed=1
        )
    )
    phases = {p.name: p for p in schedule.phases}
    assert (phases["warm"].start_s, phases["warm"].end_s) == (0.0, 2.0)
    assert (phases["idle"].start_s, phases["idle"].end_s) == (2.0, 302.0)
    assert (phases["burst"].start_s, phases["burst"].end_s) == (302.0, 312.0)
    warm = [a for a in schedule.arrivals if a.at_s < 2.0]
    assert sorted(a.model.name for a in warm) == sorted(m.name for m in MODELS)
    assert not [a for a in schedule.arrivals if 2.0 <= a.at_s < 302.0]
    burst = [a for a in schedule.arrivals if a.at_s >= 302.0]
    assert len(burst) == pytest.approx(200, rel=0.3)
    assert schedule.end_s == 312.0


def test_diurnal_follows_each_client_region_s_local_day() -> None:
    day_s = 240.0
    schedule = build_schedule(
        config(scenario="diurnal", rate_rps=60, duration_s=2 * day_s, day_s=day_s,
               trough_ratio=0.0, seed=2)
    )  # fmt: skip
    assert [(p.name, p.start_s, p.end_s) for p in schedule.phases] == [
        ("day 1", 0.0, day_s),
        ("day 2", day_s, 2 * day_s),
    ]

    def local_hours(name: str) -> np.ndarray:
        region = region_named(name)
        times = np.array([a.at_s for a in schedule.arrivals if a.region.name == name])
        return (times / day_s * 24.0 + region.lon / 15.0) % 24.0

    for name in ("eu-central", "asia-northeast", "na-west"):
        hours = local_hours(name)
        # A cosine day peaking at 14:00 local with a silent night: the afternoon is busy, the
        # small hours next to empty, whatever the region's UTC offset.
        afternoon = np.sum((hours >= 11) & (hours < 17))
        night = np.sum((hours < 3) | (hours >= 23))
        assert afternoon > 10 * max(1, night), (name, afternoon, night)
    # Each region's share of the day follows its weight.
    counts = Counter(a.region.name for a in schedule.arrivals)
    weights = {r.name: r.weight for r in DEFAULT_REGIONS}
    total = sum(weights.values())
    for name in ("na-east", "asia-east"):
        assert counts[name] / len(schedule.arrivals) == pytest.approx(
            weights[name] / total, rel=0.2
        )


def test_geo_mix_spreads_clients_by_region_weight() -> None:
    schedule = build_schedule(config(scenario="geo-mix", rate_rps=50, duration_s=200))
    counts = Counter(a.region.name for a in schedule.arrivals)
    total = sum(counts.values())
    weights = {r.name: r.weight for r in DEFAULT_REGIONS}
    weight_sum = sum(weights.values())
    for name, weight in weights.items():
        share = weight / weight_sum
        sd = (share * (1 - share) / total) ** 0.5
        assert abs(counts[name] / total - share) < 5 * sd, name
    continents = {region_named(name).lat > 0 for name in counts}
    assert continents == {True, False}  # both hemispheres send traffic


def test_colo_outage_sets_and_clears_a_fault_inside_the_run() -> None:
    schedule = build_schedule(config(scenario="colo-outage", duration_s=90, fault_colo="FRA"))
    post, delete = schedule.actions
    assert (post.method, post.path, post.at_s, post.body) == (
        "POST",
        "/admin/colos/FRA/faults",
        30.0,
        {"down": True},
    )
    assert (delete.method, delete.at_s, delete.body) == ("DELETE", 60.0, None)
    assert [p.name for p in schedule.phases] == ["before", "outage", "after"]
    with pytest.raises(ValueError, match="fault_colo"):
        config(scenario="colo-outage")
    with pytest.raises(ValueError, match="must end within duration_s"):
        config(scenario="colo-outage", fault_colo="FRA", duration_s=10, outage_start_s=8)


def test_region_outage_drills_the_regions_replicas_inside_the_run() -> None:
    schedule = build_schedule(config(scenario="region-outage", duration_s=90, fault_region="ap"))
    post, delete = schedule.actions
    assert (post.method, post.path, post.at_s, post.body) == (
        "POST",
        "/admin/regions/ap/faults",
        30.0,
        {"down": True},
    )
    assert (delete.method, delete.path, delete.at_s) == ("DELETE", "/admin/regions/ap/faults", 60.0)
    assert [p.name for p in schedule.phases] == ["before", "outage", "after"]
    with pytest.raises(ValueError, match="fault_region"):
        config(scenario="region-outage")


def test_each_task_and_api_gets_its_endpoint_body_and_headers() -> None:
    def arrival(model: ModelTarget, api: str) -> Arrival:
        return Arrival(seq=7, at_s=0.0, model=model, api=api, region=region_named("asia-east"),
                       prompt=1)  # fmt: skip

    glm, _, embedding, moderation = MODELS
    chat = build_request(arrival(glm, "openai"), WorkloadSettings(max_tokens=5), "r")
    assert (chat.path, chat.endpoint, chat.stream) == ("/v1/chat/completions",) * 2 + (True,)
    assert chat.body["stream_options"] == {"include_usage": True}
    assert (chat.body["model"], chat.body["max_tokens"]) == ("glm", 5)
    assert chat.headers == {
        "x-client-geo": "31.2304,121.4737",
        "x-request-id": "r-7",
        "x-edge-cache": "bypass",
    }
    workers = build_request(arrival(glm, "workers"), WorkloadSettings(), "r")
    assert (workers.path, workers.endpoint) == ("/ai/run/glm", "/ai/run/{model}")
    assert workers.body["stream"] is True and "prompt" in workers.body
    vectors = build_request(arrival(embedding, "openai"), WorkloadSettings(), "r")
    assert (vectors.path, vectors.stream, vectors.body["model"]) == (
        "/v1/embeddings",
        False,
        "embedding",
    )
    keyed = WorkloadSettings(api_key="k", cache="allow")
    checked = build_request(arrival(moderation, "workers"), keyed, "r")
    assert (checked.path, set(checked.body)) == ("/ai/run/moderation", {"text"})
    assert checked.headers["authorization"] == "Bearer k" and "x-edge-cache" not in checked.headers


# ---- reading answers ------------------------------------------------------------------------


def chunk(content: str | None = None, usage: int | None = None) -> ServerSentEvent:
    choices = [] if content is None else [{"index": 0, "delta": {"content": content}}]
    body: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "choices": choices}
    if usage is not None:
        body["usage"] = {"prompt_tokens": 5, "completion_tokens": usage, "total_tokens": usage + 5}
    return ServerSentEvent(data=json.dumps(body))


def test_stream_tally_times_the_first_content_and_prefers_the_usage_count() -> None:
    tally = StreamTally()
    tally.add(chunk(""), 1.0)  # the role chunk: no content yet
    tally.add(ServerSentEvent(data=""), 1.1)
    tally.add(chunk("你"), 1.5)
    tally.add(chunk("好"), 1.6)
    assert (tally.first_token_s, tally.tokens) == (1.5, 2)
    tally.add(chunk(usage=7), 1.7)
    tally.add(ServerSentEvent(data="[DONE]"), 1.8)
    tally.finish()
    assert (tally.tokens, tally.content_events, tally.error) == (7, 2, None)


def test_stream_tally_reads_workers_events_and_errors() -> None:
    tally = StreamTally()
    for at, text in ((0.2, "a"), (0.3, ""), (0.4, "b")):
        tally.add(ServerSentEvent(data=json.dumps({"response": text})), at)
    tally.add(ServerSentEvent(data="[DONE]"), 0.5)
    tally.finish()
    assert (tally.first_token_s, tally.tokens, tally.error) == (0.2, 2, None)

    failed = StreamTally()
    failed.add(chunk("x"), 0.1)
    failed.add(ServerSentEvent(data=json.dumps({"error": {"message": "engine died"}})), 0.2)
    failed.add(ServerSentEvent(data="[DONE]"), 0.3)
    assert failed.error == "engine died"

    envelope = StreamTally()
    bad = {"success": False, "errors": [{"code": 500, "message": "boom"}], "result": None}
    envelope.add(ServerSentEvent(data=json.dumps(bad)), 0.1)
    assert envelope.error == "boom"

    cut = StreamTally()
    cut.add(chunk("x"), 0.1)
    cut.finish()
    assert cut.error == "stream ended before [DONE]"


def test_body_error_text_reads_both_apis_and_plain_text() -> None:
    openai = json.dumps({"error": {"message": "model busy", "type": "overloaded"}}).encode()
    workers = json.dumps({"success": False, "errors": [{"message": "no such model"}]}).encode()
    assert body_error_text(openai, 503) == "HTTP 503: model busy"
    assert body_error_text(workers, 404) == "HTTP 404: no such model"
    assert body_error_text(b"upstream\n  reset", 502) == "HTTP 502: upstream reset"


def test_edge_headers_parse_every_field_and_tolerate_junk() -> None:
    headers = httpx.Headers(
        {
            "X-Edge-Colo": "AMS",
            "x-edge-rtt-ms": "12.5",
            "x-edge-route-reason": "failover",
            "x-edge-failover": "FRA, AMS",
            "x-edge-cache": "hit",
            "x-edge-cold-start": "1",
            "x-edge-cold-start-ms": "4200",
            "x-request-id": "run-3",
        }
    )
    edge = EdgeHeaders.parse(headers)
    assert edge == EdgeHeaders(
        "AMS", 12.5, "failover", ("FRA", "AMS"), "HIT", True, 4200.0, "run-3"
    )
    junk = EdgeHeaders.parse(httpx.Headers({"x-edge-rtt-ms": "fast", "x-edge-cold-start": "0"}))
    assert (junk.rtt_ms, junk.cold_start, junk.failover) == (None, False, ())


# ---- records and summary maths --------------------------------------------------------------


def record(seq: int, latency_ms: float, **fields: Any) -> RequestRecord:
    edge = fields.pop("edge", EdgeHeaders(colo="FRA", route_reason="nearest"))
    values: dict[str, Any] = {
        "seq": seq,
        "scheduled_s": seq * 0.1,
        "sent_s": seq * 0.1,
        "model": "glm",
        "task": "chat",
        "api": "openai",
        "endpoint": "/v1/chat/completions",
        "region": "eu-central",
        "stream": True,
        "status": 200,
        "ok": True,
        "error_kind": "",
        "error": "",
        "latency_ms": latency_ms,
        "ttfb_ms": latency_ms / 2,
        "ttft_ms": latency_ms / 2,
        "tokens": 11,
        "send_lag_ms": 0.5,
        "edge": edge,
    }
    return RequestRecord(**(values | fields))


def result_of(records: list[RequestRecord], samples: tuple[ReplicaSample, ...] = ()) -> RunResult:
    schedule = Schedule("steady", (), (Phase("steady", 0.0, 100.0),))
    return RunResult(schedule, tuple(records), (), samples, (), 0, 100.0, 1.7e9)


def test_latency_stats_are_numpy_linear_percentiles() -> None:
    stats = latency_stats([float(v) for v in range(1, 101)] + [None])
    # Linear interpolation between order statistics: p50 of 1..100 is 50.5, p95 95.05, p99 99.01.
    assert (stats["count"], stats["p50"], stats["p95"], stats["p99"]) == (100, 50.5, 95.05, 99.01)
    assert (stats["mean"], stats["max"]) == (50.5, 100.0)
    assert latency_stats([])["p50"] is None


def test_summary_splits_cold_and_warm_per_model_and_colo() -> None:
    cold_edge = EdgeHeaders(colo="FRA", route_reason="nearest", cold_start=True, cold_start_ms=3000)
    records = [record(i, 100.0 + i) for i in range(10)]  # warm glm at FRA: 100..109 ms
    records += [
        record(10, 3500.0, edge=cold_edge),
        record(11, 4500.0, edge=EdgeHeaders("FRA", cold_start=True, cold_start_ms=4000.0)),
        record(12, 40.0, model="embedding", stream=False, ttft_ms=None, tokens=None,
               edge=EdgeHeaders(colo="AMS", route_reason="failover", failover=("FRA", "AMS"))),
        record(13, 900.0, model="embedding", ok=False, status=503, error_kind="http",
               error="HTTP 503: busy", edge=EdgeHeaders(colo="AMS", route_reason="failover")),
        record(14, 5.0, ok=False, status=0, error_kind="transport", error="refused",
               edge=EdgeHeaders()),
    ]  # fmt: skip
    summary = summarize(result_of(records), {"seed": 0})
    glm = summary["by_model"]["glm"]
    assert (glm["requests"], glm["ok"], glm["cold_starts"]) == (13, 12, 2)
    assert glm["errors"] == {"transport": 1}
    assert glm["warm_latency_ms"]["p50"] == pytest.approx(104.5)
    assert glm["cold_latency_ms"]["p50"] == pytest.approx(4000.0)
    assert glm["cold_start_ms"]["p50"] == pytest.approx(3500.0)
    assert glm["cold_start_ms"]["p95"] == pytest.approx(3950.0)
    assert glm["latency_ms"]["count"] == 12  # failed requests are counted, not timed
    assert glm["tokens"] == 12 * 11
    embedding = summary["by_model"]["embedding"]
    assert (embedding["errors"], embedding["error_rate"]) == ({"http 503": 1}, 0.5)
    assert embedding["ttft_ms"]["count"] == 0
    assert set(summary["by_colo"]) == {"FRA", "AMS", "(none)"}
    assert summary["by_colo"]["AMS"]["route_reasons"] == {"failover": 2}
    assert summary["by_colo"]["FRA"]["requests"] == 12
    assert summary["cold_start"]["count"] == 2
    assert summary["cold_start"]["duration_ms"]["max"] == 4000.0
    assert summary["errors"]["by_label"] == {"http 503": 1, "transport": 1}
    assert summary["errors"]["examples"]["http 503"] == "HTTP 503: busy"
    assert summary["failed_over"] == 1
    assert (summary["requests"]["ok"], summary["requests"]["errors"]) == (13, 2)
    json.dumps(summary, allow_nan=False)  # JSON-ready, no NaN


def test_decode_speed_counts_tokens_after_the_first() -> None:
    fast = record(0, 1100.0, ttft_ms=100.0, tokens=11)  # 10 tokens in 1 s
    summary = summarize(result_of([fast]), {})
    assert summary["by_model"]["glm"]["decode_tokens_per_s"]["p50"] == pytest.approx(10.0)


def test_replica_summary_reports_running_at_each_phase_start() -> None:
    samples = [
        ReplicaSample(0.0, "glm", 1, 1, "HEALTHY"),
        ReplicaSample(200.0, "glm", 0, 0, "HEALTHY"),
        ReplicaSample(310.0, "glm", 0, 1, "UPSCALING"),
        ReplicaSample(320.0, "glm", 1, 1, "HEALTHY"),
    ]
    phases = [Phase("warm", 0, 2), Phase("idle", 2, 302), Phase("burst", 302, 312)]
    summary = replica_summary(samples, phases)["glm"]
    assert summary["running_at_phase_start"] == {"warm": 1, "idle": 1, "burst": 0}
    assert (summary["min_running"], summary["max_running"], summary["max_wanted"]) == (0, 1, 1)
    # One replica from 0 s to 200 s, none to 310 s, one starting from 310 s (it counts), then
    # the last sample (held no further).
    assert summary["replica_s_by_phase"] == {"warm": 2.0, "idle": 198.0, "burst": 2.0}
    assert summary["running_replica_s_by_phase"] == {"warm": 2.0, "idle": 198.0, "burst": 0.0}
    late = replica_summary(samples, [Phase("late", 100, 330)])["glm"]["replica_s_by_phase"]
    assert late == {"late": 110.0}


def test_requests_csv_has_one_row_per_request_in_order(tmp_path: Path) -> None:
    records = [record(2, 10.0), record(0, 12.5, edge=EdgeHeaders("AMS", failover=("FRA", "AMS")))]
    write_csv(records, tmp_path / "r.csv")
    with (tmp_path / "r.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert [row["seq"] for row in rows] == ["0", "2"]
    assert (rows[0]["failover"], rows[0]["latency_ms"], rows[0]["cold_start"]) == (
        "FRA;AMS",
        "12.500",
        "0",
    )
    assert rows[1]["cold_start_ms"] == ""


def test_outputs_are_the_same_bytes_for_the_same_run(tmp_path: Path) -> None:
    records = [record(i, 80.0 + 7 * i, scheduled_s=i * 0.5) for i in range(30)]
    records.append(record(30, 2500.0, edge=EdgeHeaders("FRA", cold_start=True, cold_start_ms=2e3)))
    samples = tuple(ReplicaSample(t, "glm", int(t > 5), 1, "HEALTHY") for t in range(0, 16, 2))
    result = result_of(records, samples)
    first, second = tmp_path / "a", tmp_path / "b"
    write_outputs(result, first, {"seed": 1})
    write_outputs(result, second, {"seed": 1})
    names = sorted(p.name for p in first.iterdir())
    assert names == sorted(
        ["summary.json", "requests.csv", "replicas.csv", "report.md", "latency_over_time.png",
         "cold_vs_warm.png", "latency_by_colo.png"]
    )  # fmt: skip
    for name in names:
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


# ---- Ray Serve state, without Ray -------------------------------------------------------------


def test_parse_serve_status_counts_running_and_wanted_replicas() -> None:
    app = parse_serve_applications(SERVE_APPLICATIONS, "edge")
    assert app.status == "RUNNING"
    glm, kimi, moderation = (app.deployments[n] for n in ("glm", "kimi", "moderation"))
    assert (glm.running, glm.wanted, glm.status) == (1, 2, "UPSCALING")
    assert (kimi.running, kimi.wanted) == (0, 0)
    assert (moderation.running, moderation.wanted) == (1, 1)  # the stopping one is leaving
    with pytest.raises(ServeStatusError, match="no application 'other'"):
        parse_serve_applications(SERVE_APPLICATIONS, "other")
    with pytest.raises(ServeStatusError, match="no 'applications'"):
        parse_serve_applications({"detail": "not found"}, "edge")


def test_serve_dashboard_reads_one_rest_call_with_the_ray_token(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []

    def dashboard(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.headers.get("authorization") != "Bearer tok":
            return httpx.Response(401, text="Unauthorized")
        return httpx.Response(200, json=SERVE_APPLICATIONS)

    reader = ServeDashboard(
        "http://dash.test", token="tok", transport=httpx.MockTransport(dashboard)
    )
    assert reader().deployments["glm"].running == 1
    assert [(r.method, r.url.path) for r in seen] == [("GET", "/api/serve/applications/")]
    refused = ServeDashboard("http://dash.test", token="", transport=httpx.MockTransport(dashboard))
    with pytest.raises(ServeStatusError, match="refused the token.*RAY_AUTH_TOKEN"):
        refused()

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with pytest.raises(ServeStatusError, match="dash.test.*connection refused"):
        ServeDashboard("http://dash.test", token="t", transport=httpx.MockTransport(down))()


def test_ray_token_comes_from_the_places_ray_reads_it(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("from-home")
    assert ray_auth_token({"RAY_AUTH_TOKEN": "inline"}, home=tmp_path) == "inline"
    assert ray_auth_token({"RAY_AUTH_TOKEN_PATH": str(token_file)}, home=tmp_path) == "from-file"
    assert ray_auth_token({}, home=tmp_path) == "from-home"
    assert ray_auth_token({}, home=tmp_path / "nobody") is None


def test_scale_to_zero_delay_comes_from_serve_config() -> None:
    shipped = yaml.safe_load((REPO / "serve_config.yaml").read_text())
    delays = scale_to_zero_delays_s(shipped, ["glm-eu", "embedding-ap", "router", "absent"])
    deployments = {d["name"]: d for d in shipped["applications"][0]["deployments"]}
    expected = deployments["glm-eu"]["autoscaling_config"]["downscale_to_zero_delay_s"]
    assert delays == {"glm-eu": expected, "embedding-ap": delays["embedding-ap"], "router": None,
                      "absent": None}  # fmt: skip
    custom = {
        "applications": [
            {
                "name": "edge",
                "deployments": [
                    {
                        "name": "a",
                        "autoscaling_config": {"min_replicas": 0, "downscale_delay_s": 9},
                    },
                    {"name": "b", "autoscaling_config": {"max_replicas": 3}},  # Ray's min is 1
                ],
            }
        ]
    }
    assert scale_to_zero_delays_s(custom, ["a", "b"]) == {"a": 9.0, "b": None}


def test_replica_sampler_samples_in_the_background_and_counts_failures() -> None:
    clock = ManualClock(100.0)
    calls = {"n": 0}

    def read() -> Any:
        calls["n"] += 1
        clock.advance(1.0)  # the status call takes a second
        if calls["n"] == 2:
            raise ServeStatusError("controller busy")
        return parse_serve_applications(SERVE_APPLICATIONS)

    sampler = ReplicaSampler(read, every_s=0.01, deployments=["glm", "kimi"], clock=clock)
    sampler._t0 = 100.0  # what start(t0) sets; here the loop body is driven by hand
    sampler.sample_once()
    sampler.sample_once()
    assert [(s.t_s, s.deployment, s.running, s.wanted) for s in sampler.samples] == [
        (0.5, "glm", 1, 2),
        (0.5, "kimi", 0, 0),
    ]
    assert (sampler.error_count, sampler.recent_errors) == (1, ["controller busy"])

    threaded = ReplicaSampler(lambda: parse_serve_applications(SERVE_APPLICATIONS), every_s=0.01)
    with threaded.running(t0=0.0):
        wait_until(lambda: len(threaded.samples) >= 8, 10, "eight samples", every_s=0.005)
    assert {s.deployment for s in threaded.samples} == {"glm", "kimi", "moderation", "router"}
    taken = len(threaded.samples)
    assert taken >= 8 and len(threaded.samples) == taken  # nothing after stop()


def test_replica_sampler_takes_a_models_region_deployments_too() -> None:
    status = {
        "applications": {
            "edge": {
                "status": "RUNNING",
                "deployments": {
                    name: {"status": "HEALTHY", "replica_states": {"RUNNING": 1}}
                    for name in ("glm-eu", "glm-ap", "kimi-eu", "router", "glmx")
                },
            }
        }
    }
    clock = ManualClock(0.0)
    sampler = ReplicaSampler(
        lambda: parse_serve_applications(status), deployments=["glm"], clock=clock
    )
    sampler._t0 = 0.0
    sampler.sample_once()
    assert sorted(s.deployment for s in sampler.samples) == ["glm-ap", "glm-eu"]


# ---- whole runs against a fake router ---------------------------------------------------------

FAKE_COLOS = [
    {"id": "FRA", "city": "Frankfurt", "lat": 50.0379, "lon": 8.5622, "models": "*"},
    {"id": "AMS", "city": "Amsterdam", "lat": 52.3105, "lon": 4.7683, "models": "*"},
    {"id": "NRT", "city": "Tokyo", "lat": 35.772, "lon": 140.3929, "models": "*"},
]


class FakeRouter:
    """The router's HTTP surface in-process: x-edge-* headers, SSE streams (split mid-line, as
    the network may split them), the first call per model a cold start, and an admin API whose
    faults move traffic from FRA to AMS. It answers a model request `delay_s` late on `time`,
    the virtual time a run against it keeps."""

    def __init__(self, *, delay_s: float = 0.0, cold_start_ms: float = 850.0, fail: str = ""):
        self.time = VirtualTime()
        self.delay_s = delay_s
        self.cold_start_ms = cold_start_ms
        self.fail = fail  # a model whose requests answer 503
        self.down: set[str] = set()
        self.warm: set[str] = set()
        self.admin_calls: list[tuple[str, str, Any]] = []
        self.request_ids: list[str] = []
        self.cache_headers: set[str | None] = set()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            data = [{"id": m.name, "object": "model", "task": m.task} for m in MODELS]
            return httpx.Response(200, json={"object": "list", "data": data})
        if path.startswith("/admin/"):
            return self._admin(request)
        body = json.loads(request.content)
        model = body.get("model") or path.rsplit("/", 1)[-1]
        self.request_ids.append(request.headers["x-request-id"])
        self.cache_headers.add(request.headers.get("x-edge-cache"))
        assert request.headers["x-client-geo"]
        tried = ["FRA"] if "FRA" not in self.down else ["FRA", "AMS"]
        headers = {
            "x-edge-colo": tried[-1],
            "x-edge-rtt-ms": "4.2" if tried[-1] == "FRA" else "9.8",
            "x-edge-route-reason": "nearest" if len(tried) == 1 else "failover",
            "x-edge-failover": ",".join(tried),
            "x-edge-cache": "MISS",
        }
        if model not in self.warm:
            self.warm.add(model)
            headers |= {"x-edge-cold-start": "1", "x-edge-cold-start-ms": str(self.cold_start_ms)}
        if self.delay_s:
            await self.time.sleep(self.delay_s)
        if model == self.fail:
            error = {"error": {"message": f"{model} is overloaded", "type": "overloaded"}}
            return httpx.Response(503, headers=headers, json=error)
        if body.get("stream"):
            headers["content-type"] = "text/event-stream"
            return httpx.Response(200, headers=headers, content=self._sse(path))
        if path.startswith("/ai/run/"):
            return httpx.Response(200, headers=headers, json={"success": True, "result": {}})
        return httpx.Response(200, headers=headers, json={"object": "list", "data": []})

    def _admin(self, request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {ADMIN_KEY}":
            return httpx.Response(401, json={"error": {"message": "bad admin key"}})
        if request.url.path == "/admin/colos":
            colos = [c | {"healthy": c["id"] not in self.down} for c in FAKE_COLOS]
            return httpx.Response(200, json=colos)
        colo = request.url.path.split("/")[3]
        body = json.loads(request.content) if request.content else None
        self.admin_calls.append((request.method, colo, body))
        if request.method == "POST":
            self.down.add(colo)
        else:
            self.down.discard(colo)
        return httpx.Response(200, json={"id": colo})

    async def _sse(self, path: str) -> AsyncIterator[bytes]:
        if path.startswith("/ai/run/"):
            events = [{"response": piece} for piece in ("Hel", "lo", "!")]
        else:
            events = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
            events += [{"choices": [{"index": 0, "delta": {"content": p}}]} for p in ("你", "好")]
            events.append({"choices": [], "usage": {"completion_tokens": 3}})
        wire = "".join(f"data: {json.dumps(e)}\r\n\r\n" for e in events) + "data: [DONE]\r\n\r\n"
        raw = wire.encode()
        for start in range(0, len(raw), 37):  # 37-byte pieces split events mid-line
            await asyncio.sleep(0)
            yield raw[start : start + 37]


def run_cli(tmp_path: Path, router: FakeRouter, *argv: str) -> tuple[int, Path]:
    """The command against `router`, on its virtual time."""
    out = tmp_path / "run"
    status = parse_serve_applications(SERVE_APPLICATIONS)
    with router.time.installed():
        code = loadgen_main(
            ["--url", "http://router.test", "--out", str(out), "--admin-key", ADMIN_KEY, *argv],
            transport=httpx.MockTransport(router),
            read_status=lambda: status,
            progress=NoProgress(),
            clock=router.time,
        )
    return code, out


def test_colo_outage_run_writes_every_output_and_moves_traffic(tmp_path: Path) -> None:
    router = FakeRouter(fail="moderation")
    code, out = run_cli(
        tmp_path, router, "--scenario", "colo-outage", "--rate", "60", "--duration-s", "0.9",
        "--seed", "5", "--replicas-every-s", "0.05", "--workers-share", "0.3",
    )  # fmt: skip
    assert code == 0
    # The fault went to the colo nearest the clients (Frankfurt) and was cleared afterwards.
    assert router.admin_calls == [("POST", "FRA", {"down": True}), ("DELETE", "FRA", None)]
    assert router.down == set()

    summary = json.loads((out / "summary.json").read_text())
    with (out / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == summary["requests"]["scheduled"] == summary["requests"]["recorded"] > 20
    assert sorted(router.request_ids) == sorted(f"run-{row['seq']}" for row in rows)
    assert router.cache_headers == {"bypass"}  # the models are measured, not the cache
    assert {row["region"] for row in rows} == {"eu-central"}
    assert [e["status"] for e in summary["admin_events"]] == [200, 200]

    for row in rows:
        assert row["route_reason"] == ("failover" if row["colo"] == "AMS" else "nearest")
        if row["model"] == "moderation":
            assert (row["ok"], row["status"], row["error_kind"]) == ("0", "503", "http")
            assert row["error"] == "HTTP 503: moderation is overloaded"
        else:
            assert (row["ok"], row["status"]) == ("1", "200")
        if row["ok"] == "1" and row["stream"] == "1":
            assert int(row["tokens"]) in {2, 3}  # usage says 3 (OpenAI); Workers: 2 pieces
            assert float(row["ttfb_ms"]) <= float(row["ttft_ms"]) <= float(row["latency_ms"])
    assert summary["by_colo"]["AMS"]["route_reasons"] == {
        "failover": summary["by_colo"]["AMS"]["requests"]
    }
    assert summary["by_colo"]["FRA"]["requests"] > 0
    assert summary["by_model"]["moderation"]["errors"] == {
        "http 503": summary["by_model"]["moderation"]["requests"]
    }
    # Each model's first request was its cold start.
    assert summary["cold_start"]["count"] == len(MODELS)
    assert summary["cold_start"]["duration_ms"]["p50"] == 850.0
    assert summary["replicas"]["glm"]["max_wanted"] == 2
    assert set(summary["replicas"]) == {m.name for m in MODELS} - {"embedding"}  # not in YAML
    assert summary["params"]["fault_colo"] == "FRA"
    assert ADMIN_KEY not in (out / "summary.json").read_text()

    for png in ("latency_over_time.png", "cold_vs_warm.png", "latency_by_colo.png"):
        assert (out / png).read_bytes().startswith(PNG_MAGIC), png
        assert f"]({png})" in (out / "report.md").read_text()
    report = (out / "report.md").read_text()
    assert "# Load test: colo-outage" in report and "| AMS |" in report
    assert "fault injected" in report and "http 503" in report
    assert (out / "replicas.csv").read_text().startswith("t_s,deployment,running,wanted,status\n")


def test_sends_stay_on_schedule_while_the_server_is_slow(tmp_path: Path) -> None:
    """Open loop: with a server taking 0.5 s per request, a closed-loop sender with one
    connection would need 10 s for 20 requests; ours sends each at its time and times the wait."""
    router = FakeRouter(delay_s=0.5)
    code, out = run_cli(
        tmp_path, router, "--scenario", "steady", "--rate", "40", "--duration-s", "0.5",
        "--no-replicas", "--models", "embedding,moderation",
    )  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    with (out / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) >= 10 and all(row["ok"] == "1" for row in rows)
    # On the run's clock: each request left at its scheduled time, none waiting for an answer,
    # and was answered 0.5 s later; so the answers overlapped and the run ended with the last.
    for row in rows:
        assert float(row["sent_s"]) == pytest.approx(float(row["scheduled_s"]), abs=1e-3)
        assert float(row["send_lag_ms"]) == pytest.approx(0.0, abs=1e-3)
        assert float(row["latency_ms"]) == pytest.approx(500.0, abs=1e-3)
    last_sent_s = max(float(row["sent_s"]) for row in rows)
    assert summary["elapsed_s"] == pytest.approx(last_sent_s + 0.5, abs=2e-3)
    assert summary["elapsed_s"] < 0.5 * len(rows) / 2
    assert summary["replica_sampling"]["samples"] == 0
    assert "Not sampled" in (out / "report.md").read_text()


def test_burst_after_idle_run_sees_the_cold_starts(tmp_path: Path) -> None:
    router = FakeRouter(cold_start_ms=1234.0)
    code, out = run_cli(
        tmp_path, router, "--scenario", "burst-after-idle", "--rate", "50", "--duration-s",
        "0.3", "--warm-s", "0.1", "--idle-s", "0.3", "--models", "glm,embedding",
    )  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert [p["name"] for p in summary["phases"]] == ["warm", "idle", "burst"]
    assert summary["by_phase"]["warm"]["requests"] == 2
    assert summary["by_phase"]["warm"]["cold_starts"] == 2
    assert "idle" not in summary["by_phase"]
    assert summary["cold_start"]["duration_ms"]["p95"] == 1234.0
    assert summary["by_model"]["glm"]["cold_latency_ms"]["count"] == 1


def test_timeouts_transport_errors_and_unfinished_requests_are_recorded() -> None:
    schedule = build_schedule(config(rate_rps=50, duration_s=0.2, seed=2))
    assert schedule.arrivals

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    clock = VirtualTime()
    refused = LoadRunner(
        RunSettings("http://x"), transport=httpx.MockTransport(refuse), clock=clock
    )
    assert {r.error_kind for r in clock.run(refused.run_async(schedule)).records} == {"transport"}

    slow = FakeRouter(delay_s=2.0)
    timed_out = LoadRunner(
        RunSettings("http://x", request_timeout_s=0.05),
        transport=httpx.MockTransport(slow),
        clock=slow.time,
    )
    timed_out_result = slow.time.run(timed_out.run_async(schedule))
    assert {(r.error_kind, r.status) for r in timed_out_result.records} == {("timeout", 0)}
    # Each given up at its deadline on the run's clock, not at the router's answer 2 s later.
    assert [r.latency_ms for r in timed_out_result.records] == pytest.approx(
        [50.0] * len(schedule.arrivals)
    )

    unfinished = LoadRunner(
        RunSettings("http://x", request_timeout_s=30, drain_timeout_s=0.05),
        transport=httpx.MockTransport(slow),
        clock=slow.time,
    )
    unfinished_result = slow.time.run(unfinished.run_async(schedule))
    assert len(unfinished_result.records) == len(schedule.arrivals)
    assert {r.error_kind for r in unfinished_result.records} == {"cancelled"}
    # Cancelled when the drain timeout after the last send ran out (or at the schedule's end,
    # if later), long before the router would have answered.
    drained_s = max(schedule.arrivals[-1].at_s + 0.05, schedule.end_s)
    assert unfinished_result.elapsed_s == pytest.approx(drained_s)
    assert unfinished_result.elapsed_s < slow.delay_s


def test_an_interrupted_run_keeps_its_records_and_clears_its_fault() -> None:
    router = FakeRouter(delay_s=0.05)
    schedule = build_schedule(
        config(scenario="colo-outage", rate_rps=50, duration_s=30, fault_colo="FRA",
               outage_start_s=0.05, outage_s=20)
    )  # fmt: skip
    runner = LoadRunner(
        RunSettings("http://x", admin_key=ADMIN_KEY),
        transport=httpx.MockTransport(router),
        clock=router.time,
    )

    async def interrupt_after_a_while() -> RunResult:
        run = asyncio.create_task(runner.run_async(schedule))
        await router.time.sleep(0.4)
        run.cancel()  # what asyncio.run does on Ctrl-C
        return await run

    result = router.time.run(interrupt_after_a_while())
    # Cut short at 0.4 s of the run's 30 s, with a record for every request sent by then.
    assert result.interrupted and result.elapsed_s == pytest.approx(0.4)
    sent = [a for a in schedule.arrivals if a.at_s < 0.4]
    assert 0 < len(result.records) == len(sent) < len(schedule.arrivals)
    assert [(e.label, e.at_s) for e in result.admin_events] == [
        ("fault injected", pytest.approx(0.05)),
        ("fault cleared (early)", pytest.approx(0.4)),
    ]
    assert router.admin_calls[-1] == ("DELETE", "FRA", None) and router.down == set()
    assert json.loads(json.dumps(summarize(result, {})))["interrupted"] is True


def test_cli_refuses_what_it_cannot_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    transport = httpx.MockTransport(FakeRouter())
    args = ["--url", "http://r.test", "--out", str(tmp_path), "--no-progress"]
    assert loadgen_main([*args, "--scenario", "colo-outage", "--admin-key", ""],
                        transport=transport) == 2  # fmt: skip
    assert "--admin-key" in capsys.readouterr().err
    assert (
        loadgen_main([*args, "--scenario", "steady", "--models", "gpt"], transport=transport) == 2
    )
    assert "unknown models ['gpt']" in capsys.readouterr().err
    no_config = ["--serve-config", str(tmp_path / "none.yaml")]
    assert loadgen_main([*args, "--scenario", "burst-after-idle", *no_config],
                        transport=transport) == 2  # fmt: skip
    assert "pass --idle-s" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_cli_help_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "edgectl.loadtest", "--help"],
        capture_output=True, text=True, cwd=REPO, timeout=60, check=True,
    )  # fmt: skip
    for flag in ("--scenario", "--idle-s", "--no-replicas", "--admin-key", "--max-requests"):
        assert flag in done.stdout


def test_a_held_streams_edge_comment_gives_the_record_its_headers() -> None:
    """A stream that waited for a cold replica carries its x-edge-* headers in a comment."""
    from edgectl.loadtest.responses import stream_items

    wire = (
        ": warming region=ap\r\n\r\n: warming region=ap\r\n\r\n"
        ": edge x-edge-colo=NRT x-edge-region=ap x-edge-cold-start=1 x-edge-cold-start-ms=812.5"
        "\r\n\r\n"
        'data: {"response": "Hel"}\r\n\r\ndata: [DONE]\r\n\r\n'
    )

    async def read() -> list[Any]:
        response = httpx.Response(200, content=wire.encode())
        return [item async for item in stream_items(response)]

    headers, *events = asyncio.run(read())
    edge = EdgeHeaders.parse(httpx.Headers(headers))
    assert (edge.colo, edge.cold_start, edge.cold_start_ms) == ("NRT", True, 812.5)
    assert [e.data for e in events] == ['{"response": "Hel"}', "[DONE]"]


def test_an_answer_joined_while_it_was_made_counts_as_a_cache_hit() -> None:
    caches = ["HIT", "JOINED", "JOINED", "MISS", ""]  # "": not cacheable
    records = [record(i, 10.0, edge=EdgeHeaders("FRA", cache=c)) for i, c in enumerate(caches)]
    glm = summarize(result_of(records), {"seed": 0})["by_model"]["glm"]
    assert (glm["cache_hits"], glm["cache_joined"]) == (3, 2)
