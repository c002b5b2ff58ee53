"""deployments.ray_ext.router_metrics against Ray Serve's real RouterMetricsManager (no Ray
started): what a handle reports to the controller when a request queues at zero replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from ray.serve._private import autoscaling_metrics_codec
from ray.serve._private import router as router_module
from ray.serve._private.common import DeploymentHandleSource, DeploymentID
from ray.serve._private.config import DeploymentConfig
from ray.serve._private.metrics_utils import QUEUED_REQUESTS_KEY
from ray.serve._private.router import RouterMetricsManager
from ray.serve._private.utils import decompress_metric_report
from ray.serve.config import AutoscalingConfig
from ray.util import metrics

from deployments.ray_ext.router_metrics import sample_queue_before_push_at_zero

TAGS = ("deployment", "application", "handle", "actor_id")


class FakeController:
    """Stands in for the controller's actor handle: keeps what handles push."""

    def __init__(self) -> None:
        self.pushed: list[bytes] = []
        self.record_autoscaling_metrics_from_handle = self

    def remote(self, payload: bytes) -> None:
        self.pushed.append(payload)


def queued_values(payload: bytes) -> list[float]:
    """The queued-request samples of a pushed handle report, in either of Serve's formats."""
    if autoscaling_metrics_codec.is_columnar(payload):
        return [float(v) for v in autoscaling_metrics_codec.decode_handle_flat(payload)["q_val"]]
    return [point.value for point in decompress_metric_report(payload).queued_requests]


@pytest.fixture
def unpatched(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Whatever a test patches on the class is undone after it."""
    name = "should_send_scaled_to_zero_optimized_push"
    monkeypatch.setattr(RouterMetricsManager, name, getattr(RouterMetricsManager, name))
    yield


@pytest.fixture
def handle_metrics(unpatched: None) -> Iterator[tuple[Any, FakeController]]:
    """A handle's metrics manager for an autoscaling deployment, with one sample taken while
    idle (as its periodic recording does) and no replica."""
    loop = asyncio.new_event_loop()
    controller = FakeController()
    manager: Any = RouterMetricsManager(
        DeploymentID(name="embedding", app_name="edge"),
        "handle-1",
        "actor-1",
        DeploymentHandleSource.UNKNOWN,
        controller,  # type: ignore[arg-type]
        metrics.Counter("test_requests", tag_keys=(*TAGS, "route")),
        metrics.Gauge("test_queued", tag_keys=TAGS),
        metrics.Gauge("test_running", tag_keys=TAGS),
        loop,
    )
    scaling = AutoscalingConfig(
        min_replicas=0, max_replicas=2, metrics_interval_s=0.5, look_back_period_s=2
    )
    manager._deployment_config = DeploymentConfig(autoscaling_config=scaling)
    manager._add_autoscaling_metrics_point()
    yield manager, controller
    loop.close()


def test_unpatched_serve_reports_a_request_at_zero_replicas_as_no_request(handle_metrics):
    manager, controller = handle_metrics
    with manager.wrap_queued_request(is_retry=False, num_curr_replicas=0):
        pass
    # The push meant to wake the deployment at once carries only the idle sample: the bug.
    (payload,) = controller.pushed
    assert queued_values(payload) == [0.0]


def test_the_push_at_zero_replicas_carries_the_queued_request(handle_metrics):
    manager, controller = handle_metrics
    assert sample_queue_before_push_at_zero()
    with manager.wrap_queued_request(is_retry=False, num_curr_replicas=0):
        pass
    (payload,) = controller.pushed
    assert queued_values(payload)[-1] == 1.0


def test_a_periodic_push_still_in_flight_does_not_hold_back_the_push_at_zero(
    handle_metrics, monkeypatch: pytest.MonkeyPatch
):
    manager, controller = handle_metrics
    monkeypatch.setattr(router_module, "check_obj_ref_ready_nowait", lambda ref: False)
    manager._pending_metrics_push_ref = object()  # the controller has not answered it yet
    with manager.wrap_queued_request(is_retry=False, num_curr_replicas=0):
        pass
    assert controller.pushed == []  # Serve as shipped skips it: the next push is 0.5 s away
    assert sample_queue_before_push_at_zero()
    with manager.wrap_queued_request(is_retry=False, num_curr_replicas=0):
        pass
    (payload,) = controller.pushed
    assert queued_values(payload)[-1] == 1.0


def test_with_replicas_or_on_a_retry_nothing_is_pushed_or_sampled(handle_metrics):
    manager, controller = handle_metrics
    assert sample_queue_before_push_at_zero()
    for is_retry, replicas in ((False, 1), (True, 0)):
        with manager.wrap_queued_request(is_retry=is_retry, num_curr_replicas=replicas):
            pass
    assert controller.pushed == []
    assert [p.value for p in manager.metrics_store.data[QUEUED_REQUESTS_KEY]] == [0]


def test_patching_twice_wraps_once(unpatched: None):
    assert sample_queue_before_push_at_zero()
    patched = RouterMetricsManager.should_send_scaled_to_zero_optimized_push
    assert sample_queue_before_push_at_zero()
    assert RouterMetricsManager.should_send_scaled_to_zero_optimized_push is patched


def test_a_serve_without_the_methods_is_left_alone(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delattr(RouterMetricsManager, "should_send_scaled_to_zero_optimized_push")
    assert not sample_queue_before_push_at_zero()
