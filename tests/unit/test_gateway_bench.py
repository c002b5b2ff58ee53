"""The gateway suite's parts that need no Ray: the config copy it runs (shipped but for its ports,
folders, one model's idle delay and two unlimited keys), the summaries of each part, the parts'
client logic against a fake transport (B's own process against a local SSE server), and how its
goals read (met, missed, or not measured)."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from benchmarks.atrest.serve_files import model_deployments
from benchmarks.gateway import fairness, overhead, retry_after, single_flight
from benchmarks.gateway.metrics import MODEL_CALLS_METRIC, metric_total
from benchmarks.gateway.serve_files import (
    FLOOD_KEY,
    LIGHT_KEY,
    cluster_env,
    gateway_config,
)
from benchmarks.gateway.verdicts import goals, model_calls
from deployments.config import PROJECT_ROOT
from deployments.ingress.security import KeyStore, SecurityConfig
from deployments.serve_file import check_serve_config

SHIPPED = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
MODELS, DATA = Path("/models"), Path("/tmp/state")


def _copy(idle_delay_s: float = 2.0) -> dict[str, Any]:
    return gateway_config(SHIPPED, MODELS, DATA, 18000, 18080, "kimi", idle_delay_s)


def test_the_copy_is_the_shipped_config_but_for_ports_folders_kimis_idle_delay_and_keys(
    tmp_path: Path,
) -> None:
    config = _copy()
    assert config["http_options"] == {"host": "127.0.0.1", "port": 18000}
    assert config["controller_options"] == SHIPPED["controller_options"]  # HAProxy in front
    (app,) = config["applications"]
    assert app["args"]["models_dir"] == "/models" and app["args"]["data_dir"] == "/tmp/state"
    kimi = model_deployments(config, "kimi")
    assert [d["name"] for d in kimi] == ["kimi-eu", "kimi-us", "kimi-ap"]
    for deployment in kimi:
        scaling = deployment["autoscaling_config"]
        assert scaling["downscale_delay_s"] == scaling["downscale_to_zero_delay_s"] == 2.0
        assert scaling["min_replicas"] == 0
    shipped = {d["name"]: d for d in SHIPPED["applications"][0]["deployments"]}
    others = [d for d in app["deployments"] if not d["name"].startswith("kimi")]
    assert others == [shipped[d["name"]] for d in others]
    per_key = app["args"]["security"]["per_key"]
    unlimited = {"requests_per_minute": None, "tokens_per_minute": None}
    assert per_key == {"flood": unlimited, "light": unlimited}
    assert SHIPPED["applications"][0]["args"]["security"]["per_key"] == {}  # a copy
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    assert check_serve_config(path) == []  # what `edge check` says before a deploy


def test_the_clusters_environment_holds_both_keys_as_the_router_reads_them() -> None:
    keys = KeyStore.from_env(cluster_env(), SecurityConfig())
    assert keys.authenticate(f"Bearer {FLOOD_KEY}").key_id == "flood"
    assert keys.authenticate(f"Bearer {LIGHT_KEY}").key_id == "light"


def test_the_model_call_count_is_summed_over_replicas_for_one_model() -> None:
    text = "\n".join(
        [
            "# HELP ray_edge_model_batch_size_count Largest batch",
            f'{MODEL_CALLS_METRIC}{{model="glm",replica="a"}} 3.0',
            f'{MODEL_CALLS_METRIC}{{model="glm",replica="b"}} 2.0',
            f'{MODEL_CALLS_METRIC}{{model="kimi",replica="c"}} 7.0',
            'ray_edge_model_batch_size_bucket{model="glm",le="1"} 5.0',
        ]
    )
    assert metric_total(text, MODEL_CALLS_METRIC, {"model": "glm"}) == 5.0
    assert metric_total(text, MODEL_CALLS_METRIC, {"model": "moderation"}) is None


def _answer(ms: float, cache: str, choices: str = "same", status: int = 200):
    return single_flight.Answer(ms / 1000, status, cache, choices if status == 200 else None)


def test_the_burst_summary_puts_the_waiters_p50_beside_the_first() -> None:
    answers = [_answer(100, "MISS")] + [_answer(102 + i, "JOINED") for i in range(31)]
    summary = single_flight.summarise(answers)
    assert summary["cache"] == {"JOINED": 31, "MISS": 1}
    assert summary["first_ms"] == 100.0 and summary["waiters_ms"]["p50"] == 117.0
    assert summary["waiters_p50_over_first_ms"] == 17.0
    assert summary["distinct_answers"] == 1 and summary["answered"] == 32


def test_bursts_are_judged_each_on_its_own_and_together_on_their_median() -> None:
    quick = [_answer(100, "MISS")] + [_answer(101, "JOINED")] * 3
    slow = [_answer(50, "MISS")] + [_answer(80, "JOINED"), _answer(81, "HIT", choices="other")]
    no_waiter = [_answer(60, "MISS")]
    summary = single_flight.summarise_bursts([quick, slow, no_waiter], model_calls=3.0)
    assert summary["bursts"] == 3 and summary["requests"] == 8 and summary["answered"] == 8
    assert summary["cache"] == {"HIT": 1, "JOINED": 4, "MISS": 3}
    assert summary["distinct_answers"] == 2  # the slow burst's two answers differ
    assert summary["waiters_p50_over_first_ms"] == [1.0, 30.5, None]
    over = goals({"single_flight": summary})["single_flight_waiters_p50_over_first_ms"]
    assert over["value"] == 15.75 and over["met_in"] == "1 of 3" and not over["met"]
    assert goals({"single_flight": summary})["single_flight_model_calls"]["value"] == 1.0


class _Chat(BaseHTTPRequestHandler):
    """A gateway on a real socket, keep-alive: GETs (the warm-up) answer `{}`; the first POST a
    MISS, the others JOINED; each POST's body is kept."""

    protocol_version = "HTTP/1.1"
    posts: list[bytes] = []
    gets = 0

    def do_GET(self) -> None:
        type(self).gets += 1
        self._json(200, {}, {})

    def do_POST(self) -> None:
        type(self).posts.append(self.rfile.read(int(self.headers["content-length"])))
        cache = "MISS" if len(type(self).posts) == 1 else "JOINED"
        self._json(200, {"choices": [{"message": {"content": "hi"}}]}, {"x-edge-cache": cache})

    def _json(self, status: int, body: dict[str, Any], headers: dict[str, str]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(status)
        for name, value in {**headers, "content-length": str(len(payload))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


def test_identical_requests_leave_together_on_warm_connections_and_each_answer_is_kept() -> None:
    _Chat.posts, _Chat.gets = [], 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        answers = asyncio.run(
            single_flight.identical_at_once(
                f"{base}/v1/chat/completions",
                {"authorization": "Bearer k"},
                {"model": "glm"},
                4,
                _ticks(),
                warm_url=f"{base}/v1/models",
            )
        )
    finally:
        server.shutdown()
        server.server_close()
    assert _Chat.gets == 4 and len(_Chat.posts) == 4 and len(set(_Chat.posts)) == 1
    assert json.loads(_Chat.posts[0]) == {"model": "glm"}
    assert sorted(a.cache or "" for a in answers) == ["JOINED", "JOINED", "JOINED", "MISS"]
    assert all(a.status == 200 and a.latency_s > 0 for a in answers)
    assert single_flight.summarise(answers)["distinct_answers"] == 1


def _ticks():
    """A clock that moves 1 ms each time it is read."""
    counter = itertools.count()
    return lambda: next(counter) / 1000


def test_a_streams_summary_counts_refusals_and_those_without_retry_after() -> None:
    outcomes = [
        fairness.StreamOutcome(200, 0.05, 96),
        fairness.StreamOutcome(200, 0.15, 90),
        fairness.StreamOutcome(429, retry_after="2"),
        fairness.StreamOutcome(503),
        fairness.StreamOutcome(fairness.NO_STATUS),
    ]
    summary = fairness.summarise(outcomes)
    assert summary["statuses"] == {"0": 1, "200": 2, "429": 1, "503": 1}
    assert summary["refused"] == 3 and summary["refused_without_retry_after"] == 1
    assert summary["failed_without_status"] == 1
    assert summary["ttft_ms"]["p50"] == 100.0 and summary["mean_completion_tokens"] == 93.0
    assert fairness.backoff_s("2") == 2.0 and fairness.backoff_s(None) == fairness.backoff_s("x")


def _sse(*events: dict[str, Any]) -> bytes:
    """A chat stream's body: each event, then [DONE]."""
    lines = [f"data: {json.dumps(event)}\n\n" for event in events]
    return "".join([*lines, "data: [DONE]\n\n"]).encode()


CHAT_STREAM = _sse(
    {"choices": [{"delta": {"content": "Hi"}}]},
    {"choices": [{"delta": {"content": " there"}}]},
    {"choices": [], "usage": {"completion_tokens": 2}},
)
REFUSED_REQUEST = 2  # the light server refuses B's second stream, with a Retry-After
LIGHT_COUNT = 3  # B's streams
HANDSHAKE_S = 20.0  # a guard only: each side waits on the other's event, set within ms


class _LightChat(BaseHTTPRequestHandler):
    """A chat model behind the gateway, on a real socket (B's process cannot share a fake
    transport): an SSE stream at once, but a 429 for the REFUSED_REQUEST-th request. Its first
    request answers only once the suite's event loop is held (`loop_held`), so every one of B's
    streams runs while that loop cannot read anything."""

    requests = 0
    first_arrived = threading.Event()
    loop_held = threading.Event()
    all_arrived = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        type(self).requests += 1
        if type(self).requests == 1:
            type(self).first_arrived.set()
            type(self).loop_held.wait(HANDSHAKE_S)
        if type(self).requests == LIGHT_COUNT:
            type(self).all_arrived.set()
        if type(self).requests == REFUSED_REQUEST:
            self.send_response(429)
            self.send_header("retry-after", "3")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        self.wfile.write(CHAT_STREAM)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass


@pytest.fixture
def light_chat_url() -> Iterator[str]:
    _LightChat.requests = 0
    for event in (_LightChat.first_arrived, _LightChat.loop_held, _LightChat.all_arrived):
        event.clear()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LightChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/chat/completions"
    server.shutdown()
    server.server_close()


def test_b_is_timed_in_its_own_process_while_a_blocks_the_suites_event_loop(
    light_chat_url: str,
) -> None:
    """Once B's process is sending, A's next answer holds the suite's event loop (its parsing,
    overdone) until all of B's streams have reached the socket: B, timed by a process of its own,
    gets its answers meanwhile (read by that loop, its second request could never be sent and the
    hold would run out)."""
    holds: list[bool] = []

    async def flood_answer(request: httpx.Request) -> httpx.Response:
        if _LightChat.first_arrived.is_set() and not holds:
            _LightChat.loop_held.set()
            holds.append(_LightChat.all_arrived.wait(HANDSHAKE_S))  # blocks this event loop
        await asyncio.sleep(0)
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, content=CHAT_STREAM, headers=headers)

    async def flood_beside() -> tuple[list[fairness.StreamOutcome], list[fairness.StreamOutcome]]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(flood_answer)) as client:
            flood = fairness.Caller("http://gw/v1/chat/completions", {}, {"model": "glm"})
            light = fairness.Caller(light_chat_url, {"authorization": "Bearer b"}, {"model": "glm"})
            return await fairness.flood_beside(
                client, flood, 1, 0.0, light, LIGHT_COUNT, 0.0, _ticks()
            )

    flooded, lightly = asyncio.run(flood_beside())
    assert holds == [True]  # all of B's streams were sent while this process's loop was held
    assert flooded and all(outcome.status == 200 for outcome in flooded)
    assert _LightChat.requests == LIGHT_COUNT  # B's streams reached the socket; A's never did
    assert [outcome.status for outcome in lightly] == [200, 429, 200]
    assert lightly[1] == fairness.StreamOutcome(429, retry_after="3")
    answered = [lightly[0], lightly[2]]
    assert all(outcome.tokens == 2 for outcome in answered)
    assert all((outcome.ttft_s or 0.0) > 0 for outcome in answered)


def test_retry_and_poll_tries_alternate_while_both_last() -> None:
    assert retry_after.kinds(3, 2) == ["retry", "poll", "retry", "poll", "retry"]
    assert retry_after.kinds(1, 3) == ["retry", "poll", "poll", "poll"]


def test_the_estimate_reads_retry_after_ms_first() -> None:
    assert retry_after.estimate_s({"retry-after-ms": "1250", "retry-after": "2"}) == 1.25
    assert retry_after.estimate_s({"retry-after": "2"}) == 2.0
    assert retry_after.estimate_s({}) is None


class _ColdModel:
    """A model at zero behind the gateway: rejectIfBusy is a 429 until `ready_after` requests."""

    def __init__(self, ready_after: int, estimate_ms: int):
        self.requests, self.ready_after, self.estimate_ms = 0, ready_after, estimate_ms

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        if self.requests > self.ready_after:
            return httpx.Response(200, json={"result": {"response": "ok"}})
        return httpx.Response(429, headers={"retry-after-ms": str(self.estimate_ms)})


def _try(model: _ColdModel, kind: retry_after.Kind) -> retry_after.RetryTry:
    async def at_zero() -> float:
        return 1.5

    async def one() -> retry_after.RetryTry:
        async with httpx.AsyncClient(transport=httpx.MockTransport(model)) as client:
            caller = retry_after.BusyCaller("http://gw/ai/run/kimi", {}, {"messages": []})
            return await retry_after.one_try(client, caller, kind, at_zero, 0.001, 5, _ticks())

    return asyncio.run(one())


def test_a_retry_try_retries_once_at_the_estimate() -> None:
    met = _try(_ColdModel(ready_after=1, estimate_ms=1), "retry")
    assert (met.status, met.estimate_s, met.retry_status, met.to_zero_s) == (429, 0.001, 200, 1.5)
    missed = _try(_ColdModel(ready_after=2, estimate_ms=1), "retry")
    assert missed.retry_status == 429  # no second chance


def test_a_poll_try_keeps_when_the_first_answered_poll_was_sent() -> None:
    polled = _try(_ColdModel(ready_after=3, estimate_ms=1), "poll")
    assert polled.retry_status is None and polled.ready_s is not None and polled.ready_s > 0


def test_the_retry_summary_splits_retries_polls_and_tries_not_refused() -> None:
    tries = [
        retry_after.RetryTry("retry", 3.0, 429, 1.2, retry_status=200),
        retry_after.RetryTry("retry", 3.0, 429, 0.8, retry_status=429),
        retry_after.RetryTry("poll", 3.0, 429, 1.0, ready_s=0.6),
        retry_after.RetryTry("poll", 3.0, 429, 1.0, ready_s=None),
        retry_after.RetryTry("retry", None, 200, None),
    ]
    summary = retry_after.summarise(tries)
    assert summary["refused_with_estimate"] == 4 and summary["not_refused"] == {"200": 1}
    assert summary["first_retry_success_share"] == 0.5
    assert summary["estimate_median_s"] == 1.0 and summary["ready_median_s"] == 0.6
    assert summary["estimate_max_s"] == 1.2
    assert summary["polls_never_answered"] == 1 and len(summary["per_try"]) == 5


def test_the_overhead_inputs_are_unique_to_the_run_and_absent_headers_counted() -> None:
    texts = overhead.inputs(300, "r1")
    assert len(set(texts)) == 300 and all("(r1 " in text for text in texts)
    summary = overhead.summarise([0.4, 0.6, None], [0.01, 0.02, 0.03])
    assert summary["without_header"] == 1 and summary["overhead_ms"]["p50"] == 0.5


def _figures() -> dict[str, Any]:
    ttft = lambda p50, p99: {"ttft_ms": {"p50": p50, "p99": p99}}  # noqa: E731
    return {
        "single_flight": {
            "requests": 32,
            "answered": 32,
            "statuses": {"200": 32},
            "cache": {"JOINED": 31, "MISS": 1},
            "bursts": 1,
            "model_calls_counted": 1.0,
            "distinct_answers": 1,
            "waiters_p50_over_first_ms": [2.0],
        },
        "fairness": {
            "light_alone": {**ttft(20.0, 30.0), "refused": 0},
            "light": {**ttft(60.0, 80.0), "refused": 0},
            "flood": {**ttft(1000.0, 2000.0), "refused_without_retry_after": 0},
        },
        "retry_after": {
            "first_retry_success_share": 0.85,
            "estimate_median_s": 0.9,
            "estimate_max_s": 1.1,
            "ready_median_s": 0.7,
        },  # fmt: skip
        "overhead": {"overhead_ms": {"p50": 0.6}},
    }


def test_every_goal_is_met_by_figures_within_its_bounds() -> None:
    judged = goals(_figures())
    assert all(record["met"] for record in judged.values()), judged
    # B's target is the looser of A's median / 4 (250 ms) and 3x B alone (90 ms).
    assert judged["fairness_light_ttft_p99_ms"]["target"] == 250.0
    assert judged["retry_after_estimate_s"]["target"] == 1.4  # 2 x 0.7 s, above the 1 s floor


def test_misses_say_what_was_measured_or_why_nothing_was() -> None:
    figures = _figures()
    figures["single_flight"].update(model_calls_counted=None, cache={"MISS": 3, "JOINED": 29})
    figures["fairness"]["light"]["refused"] = 2
    figures["retry_after"] = {"error": "TimeoutError: kimi never reached zero"}
    judged = goals(figures)
    calls = judged["single_flight_model_calls"]
    assert calls["value"] == 3 and not calls["met"] and "MISS" in calls["note"]
    assert judged["fairness_light_refusals"]["value"] == 2
    estimate = judged["retry_after_estimate_s"]
    assert estimate["value"] is None and "kimi never reached zero" in estimate["missing"]
    assert not judged["retry_after_first_retry_success_share"]["met"]
    assert not goals({})["overhead_p50_ms"]["met"]


def test_a_counter_that_did_not_move_while_a_model_answered_is_not_trusted() -> None:
    assert model_calls({"model_calls_counted": 0.0, "cache": {"MISS": 1}})[0] == 1.0
    assert model_calls({"model_calls_counted": 2.0, "cache": {"MISS": 1}})[0] == 2.0
    assert model_calls({})[0] is None


def test_a_model_ready_by_the_time_its_refusal_came_back_is_a_reading() -> None:
    figures = _figures()
    figures["retry_after"].update(estimate_max_s=0.5, ready_median_s=0.0)
    estimate = goals(figures)["retry_after_estimate_s"]
    assert (estimate["value"], estimate["target"], estimate["met"]) == (0.5, 1.0, True)
    figures["retry_after"].update(estimate_median_s=0.5, estimate_max_s=3.55)  # one is judged
    assert not goals(figures)["retry_after_estimate_s"]["met"]
