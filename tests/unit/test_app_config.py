"""serve_config.yaml as shipped validates; bad values fail naming the field and what is allowed."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.config import (
    PROJECT_ROOT,
    AppConfig,
    BatchingConfig,
    ConfigError,
    parse_app_config,
    serve_switches,
)
from deployments.serve_file import check_serve_config, serve_only, without_regions
from edge_sim.config import EdgeConfig
from edge_sim.network import EdgeNetwork
from edgectl.loadtest.regions import CITY_PROBES

SERVE_CONFIG = Path(__file__).resolve().parents[2] / "serve_config.yaml"


@pytest.fixture(scope="module")
def application() -> dict[str, Any]:
    (app,) = yaml.safe_load(SERVE_CONFIG.read_text(encoding="utf-8"))["applications"]
    return app


@pytest.fixture
def args(application: dict[str, Any]) -> dict[str, Any]:
    """A fresh copy per test, so a test may break it."""
    return copy.deepcopy(application["args"])


def config_error(args: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_app_config(args)
    return str(caught.value)


# ---- the shipped file --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("models", "gated"),
    [(["glm", "moderation"], ["glm"]), (["glm", "embedding"], []), (["embedding"], [])],
)
def test_serving_only_some_models_keeps_a_valid_config(
    args: dict[str, Any], models: list[str], gated: list[str]
):
    """What tools deploying part of the file get: their models' prices, and the gate only on
    served chat models, and only while its moderation model is served."""
    assert config_error({**args, "models": {m: args["models"][m] for m in models}})
    serve_only(args, models)
    config = parse_app_config(args)
    assert sorted(config.models) == sorted(models)
    assert set(config.observability.prices) <= set(models)
    assert config.security.moderation_gate.models == gated


def test_the_shipped_args_validate(args: dict[str, Any]):
    config = parse_app_config(args)
    assert isinstance(config, AppConfig)
    assert set(config.models) == set(args["models"])
    assert {name: model.task for name, model in config.models.items()} == {
        name: model["task"] for name, model in args["models"].items()
    }
    router = args["router"]
    assert config.router.max_body_bytes == router["max_body_bytes"]
    assert config.router.failover_attempts == router["failover_attempts"]
    assert config.router.cache.ttl_s == router["cache"]["ttl_s"]


def test_the_shipped_edge_section_validates_as_edge_config(args: dict[str, Any]):
    edge = EdgeConfig.from_mapping(args["edge"], base_dir=SERVE_CONFIG.parent)
    assert edge.latency.real_delay_scale == args["edge"]["latency"]["real_delay_scale"]
    policy = args["edge"]["region_policy"]
    assert (
        edge.region_policy.health.consecutive_failures == policy["health"]["consecutive_failures"]
    )
    assert edge.routing.max_candidates == args["edge"]["routing"]["max_candidates"]
    assert len(edge.resolved_topology.colos) > 0
    assert parse_app_config(args).edge == edge


def test_the_validated_config_round_trips_through_json(args: dict[str, Any]):
    # The router deployment receives the config as JSON (`config.model_dump(mode="json")`).
    config = parse_app_config(args)
    assert AppConfig.model_validate(config.model_dump(mode="json")) == config


# ---- bad values --------------------------------------------------------------------------------


def _set(*path_and_value: Any) -> Callable[[dict[str, Any]], None]:
    *path, value = path_and_value

    def change(args: dict[str, Any]) -> None:
        target = args
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (_set("router", "max_body_bytes", 10), ["args.router.max_body_bytes", "1024"]),
        (_set("router", "max_body_bytes", 1 << 40), ["args.router.max_body_bytes", "67108864"]),
        (_set("router", "failover_attempts", 0), ["args.router.failover_attempts", "1"]),
        (_set("router", "cache", "ttl_s", 0), ["args.router.cache.ttl_s", "greater than 0"]),
        (_set("models", "glm", "num_cpus", 0), ["args.models.glm.num_cpus", "greater than 0"]),
        (_set("models", "glm", "num_gpus", 9), ["args.models.glm.num_gpus", "8"]),
        (_set("models", "kimi", "task", "translate"), ["args.models.kimi.task", "'chat'"]),
        (_set("accelerator", "tpu"), ["args.accelerator", "'auto'", "'cpu'", "'gpu'"]),
        (_set("bogus", 1), ["args.bogus", "Extra inputs are not permitted"]),
        (_set("router", "timeout", 5), ["args.router.timeout", "Extra inputs are not permitted"]),
        (_set("models", "glm", "gpus", 1), ["args.models.glm.gpus", "not permitted"]),
        (_set("edge", "latency", "jitter_ms", -1), ["args.edge.latency.jitter_ms", "0"]),
        (_set("edge", "faults", {"XXX": [{"down": True}]}), ["args.edge", "XXX"]),
        (
            _set("models", "embedding", "attempt_timeout_s", 120),
            ["models.embedding.attempt_timeout_s (120)", "request_timeout_s (120)"],
        ),
        (_set("models", "moderation", "attempt_timeout_s", 0), ["attempt_timeout_s", "than 0"]),
    ],
)
def test_a_bad_value_names_its_field_and_the_allowed_values(
    args: dict[str, Any], change: Callable[[dict[str, Any]], None], expected: list[str]
):
    change(args)
    message = config_error(args)
    assert message.startswith("invalid serve_config.yaml")
    for fragment in expected:
        assert fragment in message


def test_every_problem_is_listed(args: dict[str, Any]):
    args["router"]["max_body_bytes"] = 10
    args["accelerator"] = "tpu"
    message = config_error(args)
    assert "args.router.max_body_bytes" in message and "args.accelerator" in message


@pytest.mark.parametrize("name", ["router", "glm v2", "glm.v2", "glm/2", ""])
def test_a_model_name_that_cannot_be_a_deployment_name_is_refused(args: dict[str, Any], name: str):
    args["models"][name] = dict(args["models"]["glm"])
    assert repr(name) in config_error(args)


@pytest.mark.parametrize("name", ["glm-v2", "glm_v2", "GLM2"])
def test_dashes_and_underscores_are_allowed_in_model_names(args: dict[str, Any], name: str):
    args["models"][name] = {**args["models"]["glm"], "aliases": []}
    assert name in parse_app_config(args).models


@pytest.mark.parametrize(
    ("alias", "fragment"),
    [("@cf/zai-org/glm-4.7-flash", "already names 'glm'"), ("kimi", "already names 'kimi'")],
)
def test_an_alias_names_one_model_only(args: dict[str, Any], alias: str, fragment: str):
    args["models"]["embedding"] = {**args["models"]["embedding"], "aliases": [alias]}
    assert fragment in config_error(args)


@pytest.mark.parametrize("name", ["router", "edge-control", "warm-pool", "front-spare"])
def test_a_model_named_like_an_app_deployment_is_refused_as_reserved(
    args: dict[str, Any], name: str
):
    args["models"][name] = {**args["models"]["glm"], "aliases": []}
    message = config_error(args)
    assert "args.models" in message and "reserved" in message
    assert "alphanumeric" not in message  # it is: the name is taken by the app itself


def test_at_least_one_model_is_served(args: dict[str, Any]):
    args["models"] = {}
    assert "at least one model" in config_error(args)


def test_a_config_error_is_a_value_error_without_the_pydantic_chain(args: dict[str, Any]):
    args["accelerator"] = "tpu"
    with pytest.raises(ValueError) as caught:
        parse_app_config(args)
    assert isinstance(caught.value, ConfigError)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


# ---- model paths -------------------------------------------------------------------------------


def test_relative_model_dirs_resolve_under_the_project_root(
    args: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)  # Ray starts replicas in some other directory
    config = parse_app_config(args)
    assert Path(__file__).resolve().parents[2] == PROJECT_ROOT
    for name, model in args["models"].items():
        path = config.model_path(name)
        assert path.is_absolute()
        assert path == PROJECT_ROOT / args["models_dir"] / model["model_dir"]


def test_an_absolute_models_dir_is_used_as_is(args: dict[str, Any], tmp_path: Path):
    args["models_dir"] = str(tmp_path)
    assert parse_app_config(args).model_path("glm") == tmp_path / args["models"]["glm"]["model_dir"]


def test_an_absolute_model_dir_ignores_models_dir(args: dict[str, Any], tmp_path: Path):
    args["models"]["glm"]["model_dir"] = str(tmp_path / "elsewhere")
    assert parse_app_config(args).model_path("glm") == tmp_path / "elsewhere"


# ---- the Ray Serve deployments section ---------------------------------------------------------


def test_deployment_sections_name_every_model_region_and_the_router(application: dict[str, Any]):
    names = [deployment["name"] for deployment in application["deployments"]]
    assert len(names) == len(set(names))
    built = parse_app_config(application["args"]).model_deployments()
    assert set(names) == {*built, "router"}
    assert ("glm", "ap") in built.values() and "glm-ap" in built


def test_every_model_deployment_scales_to_zero(application: dict[str, Any]):
    built = parse_app_config(application["args"]).model_deployments()
    for deployment in application["deployments"]:
        if deployment["name"] not in built:
            continue
        autoscaling = deployment["autoscaling_config"]
        assert autoscaling["min_replicas"] == 0, deployment["name"]
        assert autoscaling["max_replicas"] >= max(1, autoscaling.get("initial_replicas", 0))


def test_the_default_config_starts_one_region_warm_per_model(application: dict[str, Any]):
    built = parse_app_config(application["args"]).model_deployments()
    warm: dict[str, list[str]] = {}
    for deployment in application["deployments"]:
        if deployment["name"] in built:
            model, region = built[deployment["name"]]
            if deployment["autoscaling_config"].get("initial_replicas", 0) > 0:
                warm.setdefault(model, []).append(region)
    assert warm == dict.fromkeys(application["args"]["models"], ["eu"])


def test_without_regions_each_model_is_one_deployment_named_after_it(args: dict[str, Any]):
    del args["edge"]["regions"]
    built = parse_app_config(args).model_deployments()
    assert built == {name: (name, "default") for name in args["models"]}


def test_the_config_check_names_a_deployment_the_app_does_not_have(tmp_path: Path):
    config = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text())
    config["applications"][0]["deployments"].append({"name": "glm", "max_ongoing_requests": 4})
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(config))
    (problem,) = check_serve_config(path)
    assert "'glm' is not a deployment of this app" in problem and "'glm-eu'" in problem


def test_every_shipped_user_config_validates_as_batching_config(application: dict[str, Any]):
    models = application["args"]["models"]
    for deployment in application["deployments"]:
        if deployment["name"] in models:
            assert "user_config" in deployment, deployment["name"]
        if "user_config" in deployment:
            batching = BatchingConfig.model_validate(deployment["user_config"])
            assert batching.max_batch_size == deployment["user_config"]["max_batch_size"]


def test_no_deployment_section_sets_ray_actor_options(application: dict[str, Any]):
    # It would replace the resource shares build_app derives from args (and the accelerator).
    for deployment in application["deployments"]:
        assert "ray_actor_options" not in deployment, deployment["name"]


def test_serve_switches_are_the_serve_configs_so_a_plain_shell_gets_them():
    # `serve run`/`serve deploy` start Serve's controller with them; `make serve` adds nothing.
    shipped = yaml.safe_load((PROJECT_ROOT / "serve_config.yaml").read_text(encoding="utf-8"))
    switches = serve_switches(shipped)
    assert switches["RAY_SERVE_USE_GRPC_BY_DEFAULT"] == "1"
    assert float(switches["RAY_SERVE_CONTROL_LOOP_INTERVAL_S"]) < 0.1  # Serve's default
    makefile = (PROJECT_ROOT / "Makefile").read_text(encoding="utf-8")
    (serve_run,) = [line for line in makefile.splitlines() if "bin/serve run" in line]
    assert "RAY_" not in serve_run
    assert serve_switches({}) == {}


def test_batching_config_refuses_out_of_range_and_unknown_fields():
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchingConfig.model_validate({"max_batch_size": 0})
    with pytest.raises(ValueError, match="batch_wait_timeout_s"):
        BatchingConfig.model_validate({"batch_wait_timeout_s": 2})
    with pytest.raises(ValueError, match="max_batch"):
        BatchingConfig.model_validate({"max_batch": 8})


def test_without_regions_keeps_one_deployment_per_model_from_the_home_region(
    application: dict[str, Any],
):
    shipped = {"applications": [copy.deepcopy(application)]}
    single = without_regions(shipped, home="eu")
    (app,) = single["applications"]
    assert "regions" not in app["args"]["edge"]
    names = [d["name"] for d in app["deployments"]]
    assert names == [*application["args"]["models"], "router"]
    eu = {d["name"]: d for d in application["deployments"]}["glm-eu"]
    glm = {d["name"]: d for d in app["deployments"]}["glm"]
    assert glm == {**eu, "name": "glm"}
    assert "regions" in shipped["applications"][0]["args"]["edge"]  # the input is untouched
    assert parse_app_config(app["args"]).model_deployments() == {
        name: (name, "default") for name in application["args"]["models"]
    }


def test_the_city_probes_name_the_region_the_shipped_edge_really_serves_them_from(
    args: dict[str, Any],
):
    """The region tests and benchmark expect e.g. Tokyo in `ap`: that must be what the shipped
    topology and regions decide (entry colo, then its home region), not a table's say-so."""
    edge = EdgeConfig.from_mapping(args["edge"], base_dir=SERVE_CONFIG.parent)
    network, regions = EdgeNetwork(edge), edge.region_map()
    served = {}
    for city, (geo, _) in CITY_PROBES.items():
        entry = network.route("embedding", {"x-client-geo": geo}).candidates[0]
        served[city] = regions.home(entry.colo_id)
    assert served == {city: region for city, (_, region) in CITY_PROBES.items()}
    assert set(served.values()) == set(args["edge"]["regions"])  # every shipped region probed
