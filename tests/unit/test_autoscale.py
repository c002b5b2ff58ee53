"""The held-requests autoscaling policy: Serve's own request-based decision on the requests the
text replicas report holding (a coalesced call counts as its requests), never below Serve's own
count, never raising; and that Ray Serve's controller (which cannot import the project) loads it."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

from ray.serve.autoscaling_policy import replica_queue_length_autoscaling_policy
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy

from deployments.control.autoscale import (
    HELD_REQUESTS_POLICY,
    REQUESTS_METRIC,
    ByHeldRequests,
    with_total_requests,
)


def context(calls: float, held: dict[str, float] | None, queued: float = 0.0) -> AutoscalingContext:
    """One running replica, target 32 requests a replica, no delays: the decision is immediate."""
    config = AutoscalingConfig(
        min_replicas=0,
        max_replicas=4,
        target_ongoing_requests=32,
        upscale_delay_s=0,
        downscale_delay_s=0,
    )
    return AutoscalingContext(
        deployment_id=None,
        deployment_name="embedding",
        app_name="edge",
        current_num_replicas=1,
        target_num_replicas=1,
        running_replicas=[],
        total_num_requests=calls,
        total_queued_requests=queued,
        aggregated_metrics=None if held is None else {REQUESTS_METRIC: held},
        raw_metrics={},
        capacity_adjusted_min_replicas=0,
        capacity_adjusted_max_replicas=4,
        policy_state={},
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=1_800_000_000.0,
        config=config,
    )


def test_coalesced_load_scales_as_the_requests_it_carries_would():
    policy = ByHeldRequests()
    # Serve's policy answers replicas as a float (its controller rounds and bounds them).
    # 4 grouped calls in flight carrying 96 requests: Serve counts 4, the replica holds 96.
    assert replica_queue_length_autoscaling_policy(context(4, {"r1": 96}))[0] == 4 / 32
    assert policy(context(4, {"r1": 96}))[0] == 96 / 32
    # Calls queued at handles (no replica holds them yet) count as well: 60 held + 40 queued.
    assert policy(context(40, {"r1": 60}, queued=40))[0] == 100 / 32


def test_serves_own_count_wins_when_it_is_the_larger_or_no_replica_reported():
    policy = ByHeldRequests()
    assert policy(context(96, {"r1": 10}))[0] == 96 / 32  # uncoalesced traffic: Serve's count
    assert policy(context(64, None))[0] == 64 / 32  # at zero or before the first report
    assert policy(context(0, {})) == replica_queue_length_autoscaling_policy(context(0, {}))


def test_a_broken_metric_is_logged_and_the_tick_scales_by_serves_count(caplog: Any):
    decision = ByHeldRequests()(context(64, {"r1": "many"}))  # type: ignore[dict-item]
    assert decision[0] == 64 / 32 and "held-requests autoscaling failed" in caplog.text


def test_every_argument_of_serves_context_is_an_attribute_of_the_same_name():
    # The context is copied through Serve's public constructor: if Ray adds an argument that is
    # not an attribute, this fails before the controller does.
    original = context(4, {"r1": 96})
    copied = with_total_requests(original, 96)
    assert copied.total_num_requests == 96
    for name in inspect.signature(AutoscalingContext).parameters:
        if name != "total_num_requests":
            assert getattr(copied, name) == getattr(original, name), name


LOAD_IN_THE_CONTROLLER = """
import sys
from ray import cloudpickle
sys.modules["deployments"] = None  # the controller cannot import the project
policy_class = cloudpickle.loads(sys.stdin.buffer.read())
print(type(policy_class()).__name__)
"""


def test_ray_serve_ships_the_policy_by_value_to_a_process_without_the_project(tmp_path):
    policy = AutoscalingPolicy(policy_function=HELD_REQUESTS_POLICY)
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD_IN_THE_CONTROLLER],
        input=policy.get_serialized_policy_def(),
        capture_output=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr.decode()[-2000:]
    assert loaded.stdout.decode().strip() == "ByHeldRequests"
