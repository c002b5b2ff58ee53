"""Canaries: each private Ray touch of deployments.ray_ext against the pinned Ray, without starting
it. A failure here means Ray changed under us: the message says which touch, and the module's
fallback (tested here too) is what runs until the touch is redone."""

from __future__ import annotations

import copy
import importlib.util
import inspect
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import ray
from ray import cloudpickle
from ray.serve._private.client import ServeControllerClient
from ray.serve._private.controller import ServeController
from ray.serve._private.router import RouterMetricsManager
from ray.serve.schema import DeploymentDetails, DeploymentSchema, ReplicaDetails, ReplicaState

from deployments.ray_ext import (
    driver,
    haproxy_front,
    raylet,
    serve_details,
    serve_status,
    worker_setup,
)
from deployments.ray_ext.serve_details import (
    DeploymentReader,
    DeploymentReplicas,
    ServeDetailsChanged,
    parse_details,
)

# What the dashboard's GET /api/serve/applications/ answered on a live cluster: the same document
# the controller's get_serve_instance_details returns.
SERVE_DETAILS = json.loads((Path(__file__).parent / "data" / "serve_applications.json").read_text())


def controller_details() -> dict[str, Any]:
    """SERVE_DETAILS as the controller sends it: Ray 2.60 gives a starting replica a start time
    (the capture had none), which `serve.status()`'s validation requires."""
    details = copy.deepcopy(SERVE_DETAILS)
    for deployment in details["applications"]["edge"]["deployments"].values():
        for replica in deployment["replicas"]:
            replica["start_time_s"] = replica["start_time_s"] or 1796070423.0
    return details


class FakeController:
    """The controller's actor handle: `get_serve_instance_details.remote()` gives a ref that the
    patched `ray.get` turns into the document."""

    def __init__(self, details: dict[str, Any]) -> None:
        self.details = details
        self.get_serve_instance_details = self
        self.calls = 0

    def remote(self, *args: Any) -> FakeController:
        self.calls += 1
        return self


@pytest.fixture
def serve_client(monkeypatch: pytest.MonkeyPatch) -> FakeController:
    """Serve's real client class, on a fake controller, as `_get_global_client()` returns it."""
    controller = FakeController(controller_details())
    client = object.__new__(ServeControllerClient)
    client._controller = controller
    client._shutdown = False
    monkeypatch.setattr(ray, "get", lambda ref, **_: copy.deepcopy(ref.details))
    monkeypatch.setattr("ray.serve.context._get_global_client", lambda *a, **k: client)
    monkeypatch.setattr("ray.serve.api._get_global_client", lambda *a, **k: client)
    return controller


# ---- serve_status ------------------------------------------------------------------------------


def test_validating_an_autoscaling_config_still_registers_serves_policy_module_by_value(
    monkeypatch: pytest.MonkeyPatch,
):
    # Why serve_status takes turns: this registry is one set per process. If this fails, Ray
    # stopped doing it and the lock in serve_status can go.
    seen: list[tuple[str, str]] = []
    register, unregister = (
        cloudpickle.register_pickle_by_value,
        cloudpickle.unregister_pickle_by_value,
    )
    monkeypatch.setattr(
        cloudpickle,
        "register_pickle_by_value",
        lambda m: (seen.append(("+", m.__name__)), register(m)),
    )
    monkeypatch.setattr(
        cloudpickle,
        "unregister_pickle_by_value",
        lambda m: (seen.append(("-", m.__name__)), unregister(m)),
    )
    DeploymentSchema.model_validate({"name": "glm-eu", "autoscaling_config": {"max_replicas": 2}})
    assert seen == [("+", "ray.serve.autoscaling_policy"), ("-", "ray.serve.autoscaling_policy")]


def test_serve_status_runs_under_the_process_wide_lock(monkeypatch: pytest.MonkeyPatch):
    held: list[bool] = []

    def status() -> str:
        held.append(serve_status._STATUS_LOCK.locked())
        return "status"

    monkeypatch.setattr("ray.serve.status", status)
    assert serve_status.serve_status() == "status"
    assert held == [True]


# ---- serve_details -----------------------------------------------------------------------------

CAPTURED = {  # SERVE_DETAILS's deployments
    "glm": DeploymentReplicas(running=1, target=2, settling=True),  # one more starting
    "kimi": DeploymentReplicas(running=0, target=0, settling=False),  # scaled to zero
    "moderation": DeploymentReplicas(running=1, target=1, settling=True),  # one stopping
    "router": DeploymentReplicas(running=1, target=1, settling=False),
}


def test_serves_client_still_has_get_serve_details_and_the_details_what_is_read():
    assert serve_details.details_call() is not None
    assert list(inspect.signature(ServeControllerClient.get_serve_details).parameters) == ["self"]
    source = inspect.signature(ServeController.get_serve_instance_details).parameters["source"]
    assert source.default is None
    assert {"target_num_replicas", "replicas", "status"} <= set(DeploymentDetails.model_fields)
    assert {"state"} <= set(ReplicaDetails.model_fields)
    assert {s.value for s in ReplicaState} >= {"RUNNING", "STARTING", "STOPPING"}


def test_deployments_are_read_from_the_controllers_details_through_serves_client(
    serve_client: FakeController,
):
    assert DeploymentReader("edge")() == CAPTURED
    assert serve_client.calls == 1


def test_the_public_serve_status_gives_the_same_replicas_without_targets(
    serve_client: FakeController, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(serve_details, "details_call", lambda: None)  # as on a Ray without it
    read = DeploymentReader(lambda: "edge")
    assert read() == {
        name: DeploymentReplicas(d.running, None, d.settling) for name, d in CAPTURED.items()
    }
    with pytest.raises(LookupError, match="no application 'other'"):
        DeploymentReader("other")()


def test_readyz_gets_the_same_status_and_replica_states_from_details_as_from_serve_status(
    serve_client: FakeController, monkeypatch: pytest.MonkeyPatch
):
    by_details = DeploymentReader("edge")()
    monkeypatch.setattr(serve_details, "details_call", lambda: None)
    by_status = DeploymentReader("edge")()
    shown = {n: (d.status, dict(d.replica_states)) for n, d in by_details.items()}
    assert shown == {n: (d.status, dict(d.replica_states)) for n, d in by_status.items()}
    for name, deployment in shown.items():
        status, states = deployment
        assert states.get("RUNNING", 0) == CAPTURED[name].running
        assert (status != "HEALTHY" or set(states) - {"RUNNING"} != set()) == (
            CAPTURED[name].settling
        )


def test_a_serve_client_without_get_serve_details_is_found_out(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delattr(ServeControllerClient, "get_serve_details")
    assert serve_details.details_call() is None


def test_details_of_another_shape_fall_back_to_serve_status_from_then_on(
    serve_client: FakeController,
):
    broken = copy.deepcopy(SERVE_DETAILS)
    del broken["applications"]["edge"]["deployments"]["glm"]["target_num_replicas"]
    with pytest.raises(ServeDetailsChanged, match="target_num_replicas"):
        parse_details(broken, "edge")
    read = DeploymentReader("edge", get_details=lambda: broken)
    assert read()["glm"] == DeploymentReplicas(running=1, target=None, settling=True)
    assert serve_client.calls == 1  # that read, by serve.status()
    read()
    assert serve_client.calls == 2  # and the next: the broken call is not tried again
    with pytest.raises(LookupError, match="no application 'other'"):
        parse_details(SERVE_DETAILS, "other")


# ---- router_metrics ----------------------------------------------------------------------------


def test_the_router_metrics_manager_still_has_what_the_cold_start_patch_wraps():
    push = inspect.signature(RouterMetricsManager.should_send_scaled_to_zero_optimized_push)
    assert list(push.parameters) == ["self", "curr_num_replicas"]
    assert callable(RouterMetricsManager._add_autoscaling_metrics_point)
    # Both callers push right after it says yes, skipping a push while one is pending.
    source = inspect.getsource(RouterMetricsManager)
    assert "_pending_metrics_push_ref" in source
    assert source.count("should_send_scaled_to_zero_optimized_push(") >= 2


# ---- raylet --------------------------------------------------------------------------------------


def test_this_ray_has_the_raylet_rpcs_and_fields_the_warm_pool_uses():
    assert raylet.missing_rpcs() is None


def test_a_ray_without_them_is_named_and_the_pool_stays_off(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(raylet, "_STUB_METHODS", ("GetNodeStats", "PrestartWorkersV2"))
    assert raylet.missing_rpcs() == "the raylet has no PrestartWorkersV2 RPC"
    monkeypatch.setattr(raylet, "_STUB_METHODS", ("GetNodeStats",))
    monkeypatch.setattr(raylet, "_PRESTART_FIELDS", ("num_workers", "warm"))
    assert raylet.missing_rpcs() == "PrestartWorkersRequest has no field warm"

    import asyncio

    from deployments.control import warm_pool

    class RuntimeContext:
        def get_runtime_env_string(self) -> str:
            return "{}"

    monkeypatch.setattr(ray, "get_runtime_context", RuntimeContext)
    pool = warm_pool.WarmPool({"workers_per_node": 2})
    described = asyncio.run(pool.describe())
    assert described["unavailable"] == "PrestartWorkersRequest has no field warm"
    assert described["nodes"] == {}
    asyncio.run(pool.check_health())  # off, not broken: the replica stays healthy


def test_nil_ids_are_all_ff_bytes():
    assert raylet.is_nil(b"") and raylet.is_nil(b"\xff" * 28)
    assert not raylet.is_nil(b"\xff" * 27 + b"\x01")


# ---- worker_setup --------------------------------------------------------------------------------


def test_the_setup_hook_variable_and_the_replica_module_are_still_rays():
    assert worker_setup.setup_hook_env_var() == worker_setup.SETUP_HOOK_ENV_VAR
    spec = importlib.util.find_spec("ray._private.workers.default_worker")
    assert spec is not None and spec.origin is not None
    # A fresh worker runs the hook named by that variable before it takes work.
    assert "WORKER_PROCESS_SETUP_HOOK_ENV_VAR" in Path(spec.origin).read_text()
    assert importlib.util.find_spec(worker_setup.SERVE_REPLICA_MODULE) is not None


def test_a_ray_without_the_constant_gets_2_60s_name(monkeypatch: pytest.MonkeyPatch):
    from ray._private import ray_constants

    monkeypatch.delattr(ray_constants, "WORKER_PROCESS_SETUP_HOOK_ENV_VAR")
    assert worker_setup.setup_hook_env_var() == "__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"


# ---- driver --------------------------------------------------------------------------------------


def test_the_drivers_auth_reload_and_deploy_path_are_still_there():
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    assert callable(Config.initialize)
    assert callable(AuthenticationTokenLoader.instance().reset_cache)
    assert "config" in inspect.signature(ServeControllerClient.deploy_apps).parameters


def test_deploying_on_a_client_without_deploy_apps_says_so(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("ray.serve.context._get_global_client", lambda *a, **k: object())
    with pytest.raises(RuntimeError, match="no deploy_apps"):
        driver.deploy_applications(object())


def test_serves_haproxy_config_is_where_the_spare_reads_it_and_its_copy_is_valid(tmp_path: Path):
    from ray.serve._private import haproxy

    # Serve's config per node: <dir of RAY_SERVE_HAPROXY_CONFIG_FILE_LOC>/<node id>/haproxy.cfg.
    source = inspect.getsource(haproxy)  # HAProxyManager is a Ray actor class: its module's text
    assert "os.path.join(d, self._node_id, f)" in source, "Serve moved its per-node files"
    assert "config_file_path=_per_node(RAY_SERVE_HAPROXY_CONFIG_FILE_LOC)" in source
    # It writes the file in place under an exclusive flock of `<config>.lock`.
    assert 'lock_file_path = self.config_file_path + ".lock"' in source
    assert "fcntl.flock(lock_f.fileno(), fcntl.LOCK_EX)" in source
    configured = Path(haproxy.RAY_SERVE_HAPROXY_CONFIG_FILE_LOC)
    assert haproxy_front.serve_config_path("n1") == configured.parent / "n1" / configured.name
    # Two HAProxies on one port: Serve's leaves SO_REUSEPORT on only with this switch.
    assert f'"{haproxy_front.REUSE_PORT_SWITCH}"' in source
    # Serve's own template, rendered as its HAProxy would get it, then the spare's copy.
    folder = str(tmp_path)
    api = haproxy.HAProxyApi(
        cfg=haproxy.HAProxyConfig(
            socket_path=f"{folder}/admin.sock",
            server_state_base=folder,
            server_state_file=f"{folder}/server-state",
            metrics_socket_path=f"{folder}/metrics.sock",
        ),
        config_file_path=f"{folder}/haproxy.cfg",
    )
    api._generate_config_file_internal()
    rendered = haproxy_front.read_serve_config(tmp_path / "haproxy.cfg")
    assert rendered is not None
    lines = [line.strip() for line in rendered.splitlines()]
    for own in ("stats socket", "server-state-file", "load-server-state-from-file"):
        assert any(line.startswith(own) for line in lines), f"Serve's config has no {own!r}"
    for section in ("frontend prometheus", "listen stats", "frontend http_frontend"):
        assert section in lines, f"Serve's config has no {section!r} section"
    # No routes yet (as a restarted HAProxy's first config): not one the spare takes over.
    assert not haproxy_front.ready_for_traffic(rendered)
    copy = haproxy_front.spare_config(rendered)
    assert "stats socket" not in copy and "server-state" not in copy
    assert "frontend prometheus" not in copy and "listen stats" not in copy
    assert "frontend http_frontend" in copy and "bind 127.0.0.1:8000" in rendered
    (tmp_path / "spare.cfg").write_text(copy)
    check = subprocess.run(
        [haproxy_front.haproxy_binary(), "-c", "-f", str(tmp_path / "spare.cfg")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_the_head_nodes_resource_is_still_rays_name():
    from ray._common.constants import HEAD_NODE_RESOURCE_NAME

    assert haproxy_front.HEAD_NODE_RESOURCE == HEAD_NODE_RESOURCE_NAME
