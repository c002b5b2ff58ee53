"""The Kubernetes manifests in k8s/: valid against KubeRay's own CRD schemas, shaped as the
docs describe (GPU work on the GPU group only, scale to zero, read-only models, token auth),
and never drifting from serve_config.yaml and the templates. Their security: test_k8s_security."""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import jsonschema
import pytest
import yaml

from deployments import k8s
from deployments.config import ConfigError, serve_switches
from deployments.k8s.response_cache import share_across_pods

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
TEMPLATES = K8S / "templates"
# KubeRay's CRDs, vendored with their provenance (tests/data/README.md); KUBERAY_CRDS names
# another copy (a newer KubeRay's).
CRDS_ENV = "KUBERAY_CRDS"
VENDORED_CRD_DIR = REPO / "tests" / "data" / "kuberay-crds"
GPU = "nvidia.com/gpu"
ZERO_DOWNTIME_UPGRADES = {"NewCluster", "NewClusterWithIncrementalUpgrade"}


def _load(path: Path) -> dict[str, Any]:
    return yaml.load(path.read_text(), Loader=yaml.CSafeLoader)


def crd_dir(environ: dict[str, str]) -> Path | None:
    """Where KubeRay's CRDs are: $KUBERAY_CRDS, else the vendored copy; None if neither."""
    candidates = [Path(environ[CRDS_ENV])] if environ.get(CRDS_ENV) else []
    return next((d for d in [*candidates, VENDORED_CRD_DIR] if d.is_dir()), None)


@pytest.fixture(scope="module")
def crd_schemas(unavailable: Callable[[str], NoReturn]) -> dict[str, dict[str, Any]]:
    """kind -> the v1 openAPIV3Schema of KubeRay's CRD for it."""
    found = crd_dir(dict(os.environ))
    if found is None:
        unavailable(
            f"KubeRay v1.7.0 CRD schemas not found: set {CRDS_ENV} to a folder with "
            "ray.io_rayservices.yaml and ray.io_rayclusters.yaml (KubeRay's "
            f"ray-operator/config/crd/bases/), or restore {VENDORED_CRD_DIR}"
        )
    schemas = {}
    for path in sorted(found.glob("ray.io_*.yaml")):
        crd = _load(path)
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
        schemas[crd["spec"]["names"]["kind"]] = v1["schema"]["openAPIV3Schema"]
    assert {"RayService", "RayCluster"} <= schemas.keys(), f"incomplete CRDs in {found}"
    return schemas


def _k8s_files() -> list[Path]:
    return sorted(K8S.rglob("*.yaml"))


def _manifest_files() -> list[Path]:
    """What an operator applies (templates are the render's input, not manifests)."""
    return [p for p in _k8s_files() if TEMPLATES not in p.parents]


def _documents_of_kind(kind: str) -> list[dict[str, Any]]:
    return [doc for doc in map(_load, _manifest_files()) if doc.get("kind") == kind]


@pytest.fixture(scope="module")
def rayservice() -> dict[str, Any]:
    return _load(K8S / "rayservice.yaml")


@pytest.fixture(scope="module")
def serve_config(rayservice: dict[str, Any]) -> dict[str, Any]:
    return yaml.safe_load(rayservice["spec"]["serveConfigV2"])


@pytest.fixture(scope="module")
def source_config() -> dict[str, Any]:
    return yaml.safe_load((REPO / "serve_config.yaml").read_text())


def _pinned_ray_version() -> str:
    match = re.search(r'"ray\[serve\]==([^"]+)"', (REPO / "pyproject.toml").read_text())
    assert match, "pyproject.toml must pin ray[serve]==X"
    return match.group(1)


def _schema_errors(document: Any, schema: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [
        f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
        for e in validator.iter_errors(document)
    ]


def _unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields the schema does not know: Kubernetes silently prunes them, so a typo such as
    `idleTimeoutSecond` would vanish on apply instead of failing."""
    if isinstance(value, list):
        items = schema.get("items", {})
        return [e for i, v in enumerate(value) for e in _unknown_fields(v, items, f"{path}[{i}]")]
    if not isinstance(value, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    properties = schema.get("properties")
    if properties is None:  # a free-form map: check its values against additionalProperties
        values = schema.get("additionalProperties")
        if not isinstance(values, dict):
            return []
        return [e for k, v in value.items() for e in _unknown_fields(v, values, f"{path}.{k}")]
    unknown = [f"{path}.{key}" for key in value if key not in properties]
    return unknown + [
        e
        for key, v in value.items()
        if key in properties
        for e in _unknown_fields(v, properties[key], f"{path}.{key}")
    ]


def _groups(rayservice: dict[str, Any]) -> list[dict[str, Any]]:
    cluster = rayservice["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]


def _containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return group["template"]["spec"]["containers"]


def _gpus(group: dict[str, Any]) -> int:
    resources = [c.get("resources", {}) for c in _containers(group)]
    return sum(
        int(r.get(kind, {}).get(GPU, 0)) for r in resources for kind in ("limits", "requests")
    )


def _largest_delay_in(config: dict[str, Any]) -> float:
    return max(
        d["autoscaling_config"].get(key, 0)
        for app in config["applications"]
        for d in app["deployments"]
        if "autoscaling_config" in d
        for key in ("downscale_delay_s", "downscale_to_zero_delay_s")
    )


# --- every file ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", _k8s_files(), ids=lambda p: str(p.relative_to(K8S)))
def test_every_k8s_file_is_a_named_kubernetes_object(path: Path) -> None:
    document = _load(path)
    assert isinstance(document, dict), f"{path}: one YAML document expected"
    assert document.get("apiVersion") and document.get("kind"), path
    assert document.get("metadata", {}).get("name"), f"{path}: metadata.name missing"


def test_applying_the_k8s_folder_applies_one_rayservice_the_generated_one() -> None:
    # `kubectl apply -f k8s/` does not descend into templates/ or examples/.
    kinds = {p.name: _load(p)["kind"] for p in K8S.glob("*.yaml")}
    assert [name for name, kind in kinds.items() if kind == "RayService"] == ["rayservice.yaml"]
    assert {"PersistentVolumeClaim", "Job", "NetworkPolicy"} <= set(kinds.values())
    assert "Secret" not in kinds.values(), "example Secrets must not be applied with the rest"


def test_crds_come_from_kuberay_crds_else_the_vendored_copy(tmp_path: Path) -> None:
    assert crd_dir({CRDS_ENV: str(tmp_path)}) == tmp_path
    assert crd_dir({CRDS_ENV: str(tmp_path / "absent")}) == VENDORED_CRD_DIR
    assert crd_dir({}) == VENDORED_CRD_DIR


@pytest.mark.parametrize("kind", ["RayService", "RayCluster"])
def test_ray_objects_validate_against_the_kuberay_crd(
    kind: str, crd_schemas: dict[str, dict[str, Any]]
) -> None:
    for document in _documents_of_kind(kind):
        assert _schema_errors(document, crd_schemas[kind]) == []
        assert _unknown_fields(document, crd_schemas[kind]) == []
        if kind == "RayService":  # its cluster is a RayCluster spec: check it as one too
            cluster = document["spec"]["rayClusterConfig"]
            spec_schema = crd_schemas["RayCluster"]["properties"]["spec"]
            assert _schema_errors(cluster, spec_schema) == []
            assert _unknown_fields(cluster, spec_schema) == []


def test_schema_checks_catch_a_wrong_type_and_a_misspelt_field(
    rayservice: dict[str, Any], crd_schemas: dict[str, dict[str, Any]]
) -> None:
    schema = crd_schemas["RayService"]
    broken = copy.deepcopy(rayservice)
    broken["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["minReplicas"] = "zero"
    options = broken["spec"]["rayClusterConfig"]["autoscalerOptions"]
    options["idleTimeoutSecond"] = options.pop("idleTimeoutSeconds")
    assert any("minReplicas" in e for e in _schema_errors(broken, schema))
    assert _unknown_fields(broken, schema) == [
        ".spec.rayClusterConfig.autoscalerOptions.idleTimeoutSecond"
    ]


def test_token_auth_validates_and_the_schema_rejects_a_wrong_mode(
    rayservice: dict[str, Any], crd_schemas: dict[str, dict[str, Any]]
) -> None:
    cluster_schema = crd_schemas["RayCluster"]["properties"]["spec"]
    auth = rayservice["spec"]["rayClusterConfig"]["authOptions"]
    assert auth["mode"] == "token" and auth["secretName"]
    assert _schema_errors(auth, cluster_schema["properties"]["authOptions"]) == []
    broken = copy.deepcopy(rayservice)
    broken["spec"]["rayClusterConfig"]["authOptions"] = {"mode": "tokens", "secretname": "x"}
    assert any("authOptions" in e for e in _schema_errors(broken, crd_schemas["RayService"]))
    assert _unknown_fields(broken, crd_schemas["RayService"]) == [
        ".spec.rayClusterConfig.authOptions.secretname"
    ]


# --- the RayService --------------------------------------------------------------------------


def test_gpu_work_runs_on_the_gpu_group_only(rayservice: dict[str, Any]) -> None:
    head, *workers = _groups(rayservice)
    assert head["rayStartParams"]["num-gpus"] == "0"
    assert head["rayStartParams"]["num-cpus"] == "0", "no Serve replica may land on the head"
    assert _gpus(head) == 0
    gpu_groups = [g for g in workers if _gpus(g) > 0]
    for gpu_group in gpu_groups:
        for container in _containers(gpu_group):
            assert int(container["resources"]["limits"][GPU]) >= 1
        pod = gpu_group["template"]["spec"]
        assert any(t["key"] == GPU and t["effect"] == "NoSchedule" for t in pod["tolerations"])
        assert pod["nodeSelector"], "GPU pods must select GPU nodes"
        assert gpu_group["minReplicas"] == 0, "GPU nodes scale to zero with the models"
        assert gpu_group["maxReplicas"] >= 1
    cpu_groups = [g for g in workers if g not in gpu_groups]
    assert cpu_groups and all(g["minReplicas"] >= 1 for g in cpu_groups), "the router's nodes"


def test_each_region_has_its_gpu_group_carrying_its_resource(
    rayservice: dict[str, Any], serve_config: dict[str, Any]
) -> None:
    _, *workers = _groups(rayservice)
    regions = serve_config["applications"][0]["args"]["edge"]["regions"]
    gpu_groups = {g["groupName"]: g for g in workers if _gpus(g) > 0}
    assert set(gpu_groups) == {f"gpu-{region}" for region in regions}
    for region in regions:
        params = gpu_groups[f"gpu-{region}"]["rayStartParams"]
        # KubeRay's form of `ray start --resources`: a quoted, escaped JSON string.
        quoted = params["resources"]
        assert quoted[0] == quoted[-1] == '"'
        assert json.loads(quoted[1:-1].replace('\\"', '"')) == {f"region:{region}": 100}
    (ingress,) = [g for g in workers if _gpus(g) == 0]
    assert "ingress" in ingress["rayStartParams"]["resources"]
    policy = serve_config["applications"][0]["args"]["edge"]["region_policy"]
    assert policy["placement"] == "node_resource" and policy["ingress_resource"] == "ingress"


def test_autoscaler_keeps_nodes_as_long_as_serve_keeps_replicas(
    rayservice: dict[str, Any], source_config: dict[str, Any]
) -> None:
    cluster = rayservice["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"]["upscalingMode"] == "Default"
    idle_s = cluster["autoscalerOptions"]["idleTimeoutSeconds"]
    assert idle_s >= _largest_delay_in(source_config)


def test_idle_timeout_falls_back_to_serves_default_downscale_delay() -> None:
    from ray.serve.config import AutoscalingConfig

    serve_default_s = AutoscalingConfig.model_fields["downscale_delay_s"].default
    config = {"applications": [{"deployments": [{"name": "m", "autoscaling_config": {}}]}]}
    assert k8s.largest_downscale_delay_s(config) == serve_default_s
    config["applications"][0]["deployments"][0]["autoscaling_config"] = {
        "downscale_delay_s": 30,
        "downscale_to_zero_delay_s": 900,
    }
    assert k8s.autoscaler_idle_timeout_s(config) >= 900


def test_upgrades_bring_up_a_new_cluster_before_switching(rayservice: dict[str, Any]) -> None:
    assert rayservice["spec"]["upgradeStrategy"]["type"] in ZERO_DOWNTIME_UPGRADES


def test_serve_config_is_serve_config_yaml_with_only_the_k8s_overrides(
    rayservice: dict[str, Any], serve_config: dict[str, Any], source_config: dict[str, Any]
) -> None:
    models_dir = k8s.models_mount_path(rayservice)
    assert serve_config["http_options"]["host"] == "0.0.0.0"
    assert serve_config["proxy_location"] == "EveryNode"
    restored = copy.deepcopy(serve_config)
    restored["proxy_location"] = source_config["proxy_location"]
    source_http = source_config.get("http_options", {})
    if "host" in source_http:
        restored["http_options"]["host"] = source_http["host"]
    else:
        del restored["http_options"]["host"]
    if not restored["http_options"] and "http_options" not in source_config:
        del restored["http_options"]
    for app, source_app in zip(
        restored["applications"], source_config["applications"], strict=True
    ):
        assert app["args"]["accelerator"] == "gpu"
        assert app["args"]["models_dir"] == models_dir == "/models"
        for key in ("accelerator", "models_dir"):
            app["args"][key] = source_app["args"][key]
        cache = app["args"]["router"]["cache"]
        assert (cache["backend"], cache["redis_url"]) == ("redis", "redis://ray-edge-ai-redis:6379")
        app["args"]["router"]["cache"] = source_app["args"]["router"]["cache"]
        # No routers' own port: KubeRay health-checks the proxies the serve Service reaches.
        assert app["args"]["router"].pop("listener") == {"enabled": False}
        if "listener" in source_app["args"]["router"]:
            app["args"]["router"]["listener"] = source_app["args"]["router"]["listener"]
        app["args"]["edge"]["region_policy"] = source_app["args"]["edge"]["region_policy"]
    assert restored == source_config, "serveConfigV2 must be serve_config.yaml, overrides aside"


def test_models_volume_is_mounted_read_only_in_every_ray_pod(
    rayservice: dict[str, Any], serve_config: dict[str, Any]
) -> None:
    (pvc,) = _documents_of_kind("PersistentVolumeClaim")
    for group in _groups(rayservice):
        pod = group["template"]["spec"]
        (volume,) = [v for v in pod["volumes"] if v["name"] == k8s.MODELS_VOLUME]
        assert volume["persistentVolumeClaim"] == {
            "claimName": pvc["metadata"]["name"],
            "readOnly": True,
        }
        for container in pod["containers"]:
            (mount,) = [m for m in container["volumeMounts"] if m["name"] == k8s.MODELS_VOLUME]
            assert mount["readOnly"] is True
            assert mount["mountPath"] == serve_config["applications"][0]["args"]["models_dir"]


def test_every_ray_container_has_the_serve_configs_switches(rayservice: dict[str, Any]) -> None:
    # A Serve that KubeRay starts may not pass on the config's controller_options: every
    # container has them too, whichever node a proxy or replica starts on.
    switches = serve_switches(yaml.safe_load(rayservice["spec"]["serveConfigV2"]))
    assert switches["RAY_SERVE_USE_GRPC_BY_DEFAULT"] == "1"
    for group in _groups(rayservice):
        for container in group["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert switches.items() <= env.items(), container["name"]


def test_images_and_ray_version_follow_the_pinned_ray(rayservice: dict[str, Any]) -> None:
    ray_version = _pinned_ray_version()
    assert rayservice["spec"]["rayClusterConfig"]["rayVersion"] == ray_version
    for group in _groups(rayservice):
        for container in _containers(group):
            assert container["image"].endswith(f"-ray{ray_version}-gpu"), container["image"]
    (job,) = _documents_of_kind("Job")
    for container in job["spec"]["template"]["spec"]["containers"]:
        assert container["image"].endswith(f"-ray{ray_version}-cpu"), container["image"]
    dockerfile = (REPO / "Dockerfile").read_text()
    assert f"ARG RAY_VERSION={ray_version}\n" in dockerfile
    bases = re.findall(r"^FROM (\S+)", dockerfile, flags=re.MULTILINE)
    assert bases == [
        "rayproject/ray:${RAY_VERSION}-py311",
        "rayproject/ray:${RAY_VERSION}-py311-gpu",
    ]


# --- model storage ---------------------------------------------------------------------------


def test_models_job_fills_the_shared_volume_once(rayservice: dict[str, Any]) -> None:
    (pvc,) = _documents_of_kind("PersistentVolumeClaim")
    assert {"ReadWriteMany", "ReadOnlyMany"} & set(pvc["spec"]["accessModes"])
    (job,) = _documents_of_kind("Job")
    pod = job["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    (container,) = pod["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert not mount.get("readOnly", False), "the Job writes the volume"
    command = container["command"]
    assert command[:3] == ["python", "-m", "deployments.export"]
    assert command[command.index("--out") + 1] == mount["mountPath"]
    assert mount["mountPath"] == k8s.models_mount_path(rayservice)


# --- the render ------------------------------------------------------------------------------


def test_committed_manifests_are_a_fresh_render(capsys: pytest.CaptureFixture[str]) -> None:
    sources = k8s.RenderSources.of_repo(REPO)
    manifests = k8s.render(sources)
    assert {k8s.RAYSERVICE, k8s.NETWORK_POLICY, k8s.MODELS_JOB} <= manifests.keys()
    for name, text in manifests.items():
        assert (K8S / name).read_text() == text, (
            f"k8s/{name} is stale: run `python -m deployments.k8s render`"
        )
    assert k8s.main(["render", "--check"]) == 0


def test_check_fails_when_serve_config_yaml_changes(
    tmp_path: Path, source_config: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    changed = copy.deepcopy(source_config)
    first = changed["applications"][0]["deployments"][0]
    first["autoscaling_config"]["max_replicas"] += 1
    config = tmp_path / "serve_config.yaml"
    config.write_text(yaml.safe_dump(changed, sort_keys=False))

    assert k8s.main(["render", "--check", "--config", str(config)]) == 1
    captured = capsys.readouterr()
    replicas = first["autoscaling_config"]["max_replicas"]
    assert re.search(rf"^-\s+max_replicas: {replicas - 1}$", captured.out, flags=re.MULTILINE)
    assert re.search(rf"^\+\s+max_replicas: {replicas}$", captured.out, flags=re.MULTILINE)
    assert "rayservice.yaml" in captured.err and "networkpolicy.yaml" not in captured.err

    out = tmp_path / "k8s"
    assert k8s.main(["render", "--config", str(config), "--out", str(out)]) == 0
    assert k8s.main(["render", "--check", "--config", str(config), "--out", str(out)]) == 0
    (out / k8s.NETWORK_POLICY).unlink()
    assert k8s.main(["render", "--check", "--config", str(config), "--out", str(out)]) == 1


def test_render_is_the_same_bytes_every_time() -> None:
    sources = k8s.RenderSources.of_repo(REPO)
    assert k8s.render(sources) == k8s.render(sources)


def _sources_with(tmp_path: Path, **replaced: Path) -> k8s.RenderSources:
    sources = k8s.RenderSources.of_repo(REPO)
    return dataclasses.replace(sources, out_dir=tmp_path / "k8s", **replaced)


def test_render_refuses_an_invalid_app_config(
    tmp_path: Path, source_config: dict[str, Any]
) -> None:
    broken = copy.deepcopy(source_config)
    next(iter(broken["applications"][0]["args"]["models"].values()))["num_gpus"] = 0
    config = tmp_path / "serve_config.yaml"
    config.write_text(yaml.safe_dump(broken, sort_keys=False))
    with pytest.raises(ConfigError, match="num_gpus"):
        k8s.render(_sources_with(tmp_path, serve_config=config))


def test_render_refuses_a_serve_port_the_head_does_not_expose(
    tmp_path: Path, source_config: dict[str, Any]
) -> None:
    moved = copy.deepcopy(source_config)
    moved.setdefault("http_options", {})["port"] = 8001
    config = tmp_path / "serve_config.yaml"
    config.write_text(yaml.safe_dump(moved, sort_keys=False))
    with pytest.raises(ValueError, match="http_options.port"):
        k8s.render(_sources_with(tmp_path, serve_config=config))


def test_the_gcs_keeps_its_state_in_redis_with_the_password_from_a_secret(
    rayservice: dict[str, Any],
) -> None:
    # KubeRay's GCS fault tolerance: a head pod's restart keeps the workers and their replicas.
    options = rayservice["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
    assert options["redisAddress"].startswith("redis://")
    assert options["redisPassword"] == {
        "valueFrom": {"secretKeyRef": {"name": "ray-edge-ai-redis", "key": "password"}}
    }
    (example,) = [
        doc
        for doc in _documents_of_kind("Secret")
        if doc["metadata"]["name"] == "ray-edge-ai-redis"
    ]
    assert set(example["stringData"]) == {"password"}


def test_every_node_runs_a_proxy_and_every_pod_exposes_its_port(
    rayservice: dict[str, Any], serve_config: dict[str, Any]
) -> None:
    # The head is not the only way in: the serve Service reaches every pod with a healthy proxy.
    assert serve_config["proxy_location"] == "EveryNode"
    port = serve_config["http_options"]["port"]
    for group in _groups(rayservice):
        ray_container = group["template"]["spec"]["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in ray_container.get("ports", [])}
        assert ports.get("serve") == port, group.get("groupName", "head")


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        (None, "redisAddress must name the Redis"),
        ({"redisAddress": "redis://r:6379", "redisPassword": {"value": "x"}}, "redisPassword out"),
    ],
)
def test_render_refuses_a_cluster_without_redis_or_with_a_password_in_the_manifest(
    tmp_path: Path, options: dict[str, Any] | None, refusal: str
) -> None:
    template = _load(REPO / "k8s" / "templates" / "rayservice.yaml")
    cluster = template["spec"]["rayClusterConfig"]
    cluster.pop("gcsFaultToleranceOptions")
    if options is not None:
        cluster["gcsFaultToleranceOptions"] = options
    templates = tmp_path / "templates"
    templates.mkdir()
    for source in (REPO / "k8s" / "templates").iterdir():
        (templates / source.name).write_text(source.read_text())
    (templates / "rayservice.yaml").write_text(yaml.safe_dump(template, sort_keys=False))
    with pytest.raises(ValueError, match=refusal):
        k8s.render(_sources_with(tmp_path, templates=templates))


def test_the_routers_share_one_response_cache_in_redis_with_the_password_from_a_secret(
    rayservice: dict[str, Any], serve_config: dict[str, Any]
) -> None:
    # Router replicas land in different pods: a SQLite file per node would not be shared.
    for app in serve_config["applications"]:
        cache = app["args"]["router"]["cache"]
        gcs = rayservice["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"]
        assert (cache["backend"], cache["redis_url"]) == ("redis", gcs["redisAddress"])
    password = {
        "name": "EDGE_REDIS_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "ray-edge-ai-redis", "key": "password"}},
    }
    for group in _groups(rayservice):
        router_may_run = k8s.hosts_replicas(group)
        for container in _containers(group):
            assert (password in container.get("env", [])) == router_may_run, group.get(
                "groupName", "head"
            )


@pytest.mark.parametrize(
    ("cache", "expected"),
    [
        ({}, {"backend": "redis", "redis_url": "redis://gcs-redis:6379"}),
        ({"backend": "sqlite"}, {"backend": "redis", "redis_url": "redis://gcs-redis:6379"}),
        (
            {"backend": "redis", "redis_url": "redis://cache-redis:6379/2"},
            {"backend": "redis", "redis_url": "redis://cache-redis:6379/2"},
        ),
        ({"backend": "memory"}, {"backend": "memory"}),
        ({"enabled": False}, {"enabled": False}),
    ],
)
def test_the_k8s_cache_backend_follows_the_config_where_it_can_be_shared(
    cache: dict[str, Any], expected: dict[str, Any]
) -> None:
    args: dict[str, Any] = {"router": {"cache": dict(cache)}}
    share_across_pods(args, "gcs-redis:6379")  # KubeRay's bare host:port form
    assert args["router"]["cache"] == expected
