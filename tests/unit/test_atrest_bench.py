"""The at-rest suite's parts that need no Ray: the two configs it runs (ours as shipped but for its
ports, folders and, on request, idle delays; Ray Serve's hello world with Serve's defaults), which
deployments must reach zero and by when, and how its goals read."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from benchmarks.atrest import serve_files
from benchmarks.atrest.suite import goals
from deployments.config import PROJECT_ROOT

SHIPPED = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
MODELS = Path("/models")
DATA = Path("/tmp/state")


def test_ours_is_the_shipped_config_on_its_own_ports_and_folders() -> None:
    config = serve_files.ours(SHIPPED, MODELS, DATA, 18000, 18080, idle_delay_s=None)
    assert config["http_options"] == {"host": "127.0.0.1", "port": 18000}
    args = config["applications"][0]["args"]
    assert args["models_dir"] == "/models" and args["data_dir"] == "/tmp/state"
    # The routers' own port is off as shipped (HAProxy fronts 8000), and stays off in the copy.
    assert "listener" not in args.get("router", {})
    # Everything else as shipped: Serve's switches, the deployments and their delays.
    assert config["controller_options"] == SHIPPED["controller_options"]
    assert config["applications"][0]["deployments"] == SHIPPED["applications"][0]["deployments"]
    assert SHIPPED["http_options"]["port"] == 8000  # the copy changed, not the file


def test_a_shipped_router_listener_moves_to_the_suites_own_port() -> None:
    shipped = copy.deepcopy(SHIPPED)
    shipped["applications"][0]["args"].setdefault("router", {})["listener"] = {"enabled": True}
    config = serve_files.ours(shipped, MODELS, DATA, 18000, 18080, idle_delay_s=None)
    listener = config["applications"][0]["args"]["router"]["listener"]
    assert listener == {"enabled": True, "host": "127.0.0.1", "port": 18080}


def test_an_idle_delay_shortens_every_models_downscale_delays_and_nothing_else() -> None:
    config = serve_files.ours(SHIPPED, MODELS, DATA, 18000, 18080, idle_delay_s=3)
    scaled = [d for d in config["applications"][0]["deployments"] if "autoscaling_config" in d]
    assert len(scaled) == 12  # four models in three regions
    for deployment in scaled:
        scaling = deployment["autoscaling_config"]
        assert scaling["downscale_delay_s"] == scaling["downscale_to_zero_delay_s"] == 3
        assert scaling["min_replicas"] == 0
    assert serve_files.longest_idle_delay_s(config) == 3


def test_the_models_are_the_deployments_that_scale_to_zero() -> None:
    config = serve_files.ours(SHIPPED, MODELS, DATA, 18000, 18080, idle_delay_s=None)
    (models,) = serve_files.scale_to_zero_deployments(config).values()
    assert "router" not in models and {"glm-eu", "kimi-ap", "moderation-us"} <= set(models)
    # As shipped, the slowest to reach zero waits its downscale_to_zero_delay_s (5 minutes).
    assert serve_files.longest_idle_delay_s(config) == 300


def test_the_hello_world_runs_with_serves_defaults_and_no_model() -> None:
    config = serve_files.hello_world(18001)
    assert "controller_options" not in config
    assert config["http_options"]["port"] == 18001
    assert serve_files.scale_to_zero_deployments(config) == {"hello": []}
    assert serve_files.longest_idle_delay_s(config) == 0


def _side(share: float, left: dict[str, int]) -> dict:
    return {"cpu_share_of_one_core": share, "replicas_left_at_rest": left}


def test_the_goals_judge_the_difference_and_the_replicas_left() -> None:
    met = goals(_side(0.12, {}), _side(0.09, {}), 0.03)
    assert met["cpu_at_rest_over_hello_world"]["met"] is True
    assert met["cpu_at_rest_over_hello_world"]["details"] == {"ours": 0.12, "hello_world": 0.09}
    assert met["model_replicas_at_rest"]["value"] == 0 and met["model_replicas_at_rest"]["met"]
    missed = goals(_side(0.33, {"glm-eu": 1}), _side(0.09, {}), 0.24)
    assert missed["cpu_at_rest_over_hello_world"]["met"] is False
    assert missed["model_replicas_at_rest"]["value"] == 1
    assert missed["model_replicas_at_rest"]["met"] is False
