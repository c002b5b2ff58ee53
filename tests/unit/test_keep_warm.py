"""The keep-warm autoscaling policy: schedule windows, its decisions, config checks, and that Ray
Serve's controller (which cannot import the project) can load it."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime

import pytest
import yaml
from pydantic import ValidationError
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy

from deployments.config import PROJECT_ROOT
from deployments.control.keep_warm import KEEP_WARM_POLICY, KeepWarm, KeepWarmConfig, WarmWindow
from deployments.serve_file import check_serve_config

OFFICE_HOURS = {
    "days": ["mon", "tue", "wed", "thu", "fri"],
    "start": "08:55",
    "end": "18:00",
    "timezone": "Europe/Berlin",
    "replicas": 2,
}


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize(
    ("instant", "inside"),
    [
        ("2026-12-01 07:55", True),  # Tuesday 08:55 in Berlin (UTC+1 in winter)
        ("2026-12-01 07:54", False),
        ("2026-12-01 16:59", True),
        ("2026-12-01 17:00", False),  # the end is exclusive
        ("2026-12-05 10:00", False),  # Saturday
        ("2026-07-01 06:55", True),  # summer time: UTC+2
    ],
)
def test_a_weekday_window_follows_its_time_zone(instant, inside):
    assert WarmWindow.model_validate(OFFICE_HOURS).covers(utc(instant)) is inside


def test_a_window_past_midnight_belongs_to_the_day_it_starts():
    friday_night = WarmWindow(days=["fri"], start="22:00", end="06:00")
    assert friday_night.covers(utc("2026-12-04 23:00"))  # Friday
    assert friday_night.covers(utc("2026-12-05 05:59"))  # Saturday morning, still Friday's
    assert not friday_night.covers(utc("2026-12-04 05:00"))  # Friday morning is Thursday's
    assert not friday_night.covers(utc("2026-12-05 06:00"))


def test_the_default_window_is_every_day_all_day():
    always = WarmWindow()
    instants = [utc(f"2026-12-0{day} {hour:02d}:00") for day in range(1, 8) for hour in (0, 12, 23)]
    assert all(always.covers(instant) for instant in instants)


def test_overlapping_windows_ask_for_the_largest_floor():
    schedule = KeepWarmConfig.model_validate(
        {"windows": [OFFICE_HOURS, {"start": "00:00", "end": "00:00", "replicas": 1}]}
    )
    assert schedule.floor_at(utc("2026-12-01 12:00")) == 2
    assert schedule.floor_at(utc("2026-12-05 12:00")) == 1


@pytest.mark.parametrize(
    ("window", "field"),
    [
        ({"timezone": "Mars/Olympus"}, "timezone"),
        ({"days": ["monday"]}, "days"),
        ({"days": []}, "days"),
        ({"start": "25:00"}, "start"),
        (yaml.safe_load("end: 18:00"), "quoted"),  # YAML 1.1 made it the number 1080
        ({"replicas": 0}, "replicas"),
        ({"replica": 1}, "replica"),
    ],
)
def test_a_bad_window_names_its_field(window, field):
    with pytest.raises(ValidationError) as caught:
        KeepWarmConfig.model_validate({"windows": [window]})
    assert field in str(caught.value)


def test_a_bad_schedule_in_the_controller_is_logged_and_scaling_goes_on_by_requests(caplog):
    # Ray Serve's controller does not survive a policy that raises: log, never raise.
    policy = KeepWarm(windows=[{"timezone": "Berlin"}])
    assert "windows.0.timezone" in caplog.text and "ignored" in caplog.text
    tuesday_noon = utc("2026-12-01 11:00")
    assert policy(context(tuesday_noon, running=1, ongoing_requests=0))[0] == 0
    assert policy(context(tuesday_noon, running=1, ongoing_requests=16))[0] == 2
    assert KeepWarm().config is None  # no windows at all


def context(at: datetime, running: int, ongoing_requests: float) -> AutoscalingContext:
    config = AutoscalingConfig(min_replicas=0, max_replicas=4, target_ongoing_requests=8)
    return AutoscalingContext(
        deployment_id=None,
        deployment_name="kimi",
        app_name="edge",
        current_num_replicas=running,
        target_num_replicas=running,
        running_replicas=[],
        total_num_requests=ongoing_requests,
        total_queued_requests=0.0,
        aggregated_metrics={},
        raw_metrics={},
        capacity_adjusted_min_replicas=0,
        capacity_adjusted_max_replicas=4,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=at.timestamp(),
        config=config,
    )


def test_the_policy_holds_the_floor_in_a_window_and_defers_to_traffic_otherwise():
    policy = KeepWarm(windows=[OFFICE_HOURS])
    tuesday_noon, saturday_noon = utc("2026-12-01 11:00"), utc("2026-12-05 11:00")

    assert policy(context(tuesday_noon, running=0, ongoing_requests=0))[0] == 2  # wakes from zero
    assert policy(context(tuesday_noon, running=2, ongoing_requests=0))[0] == 2  # stays up idle
    assert policy(context(tuesday_noon, running=2, ongoing_requests=48))[0] == 6  # traffic wins
    assert policy(context(saturday_noon, running=1, ongoing_requests=0))[0] == 0  # back to zero
    assert policy(context(saturday_noon, running=1, ongoing_requests=16))[0] == 2


def test_the_config_check_reports_a_bad_schedule_before_deploying(tmp_path):
    config = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
    kimi = next(d for d in config["applications"][0]["deployments"] if d["name"] == "kimi-eu")
    kimi["autoscaling_config"]["policy"] = {
        "policy_function": KEEP_WARM_POLICY,
        "policy_kwargs": {"windows": [{**OFFICE_HOURS, "timezone": "Berlin"}]},
    }
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    (problem,) = check_serve_config(path)
    where = "deployments.kimi-eu.autoscaling_config.policy.policy_kwargs.windows.0.timezone"
    assert where in problem
    assert "unknown time zone 'Berlin'" in problem

    kimi["autoscaling_config"]["policy"]["policy_kwargs"]["windows"][0]["timezone"] = "UTC"
    path.write_text(yaml.safe_dump(config))
    assert check_serve_config(path) == []


LOAD_IN_THE_CONTROLLER = """
import sys, cloudpickle
from datetime import datetime, UTC
sys.modules["deployments"] = None  # the controller cannot import the project
policy_class = cloudpickle.loads(sys.stdin.buffer.read())
policy = policy_class(windows=[{"days": ["tue"], "replicas": 3}])
print(policy.config.floor_at(datetime(2026, 12, 1, 12, tzinfo=UTC)))
"""


def test_ray_serve_ships_the_policy_by_value_to_a_process_without_the_project(tmp_path):
    policy = AutoscalingPolicy(policy_function=KEEP_WARM_POLICY, policy_kwargs={"windows": [{}]})
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_IN_THE_CONTROLLER],
        input=policy.get_serialized_policy_def(),
        capture_output=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr.decode()[-2000:]
    assert loaded.stdout.decode().strip() == "3"


def test_the_benchmark_window_opens_when_asked_and_passes_the_config_check(tmp_path):
    from benchmarks.coldstart.keep_warm import with_keep_warm

    config = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
    opens = utc("2026-12-01 23:59:50")  # the window runs past midnight
    edge = with_keep_warm(config["applications"][0], "glm-eu", opens)
    config["applications"][0] = edge
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert check_serve_config(path) == []

    (glm,) = [d for d in edge["deployments"] if d["name"] == "glm-eu"]
    policy = KeepWarm(**glm["autoscaling_config"]["policy"]["policy_kwargs"])
    assert policy.floor(opens.timestamp() - 1) == 0
    assert policy.floor(opens.timestamp()) == 1
    assert policy.floor(opens.timestamp() + 599) == 1
    assert policy.floor(opens.timestamp() + 600) == 0
