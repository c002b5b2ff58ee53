"""The security of the rendered Kubernetes manifests: token auth, API keys from Secrets, hardened
pods, the NetworkPolicies, and a static policy check of all of it with checkov (run from its own
venv, `make checkov`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from deployments import k8s
from deployments.config.state import DATABASE_URL_ENV
from deployments.ingress.security import ADMIN_KEY_ENV, API_KEYS_FILE_ENV, KeyConfigError, KeyStore
from deployments.k8s import pod_security, secrets

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
K8S_DOC = REPO / "docs" / "kubernetes.md"
CHECKOV_ENV = "CHECKOV"
CHECKOV_DEFAULT = REPO / ".venv-checkov" / "bin" / "checkov"
CHECKOV_TIMEOUT_S = 300
GPU = "nvidia.com/gpu"
PEER_KEYS = {"podSelector", "namespaceSelector", "ipBlock"}
PROTOCOLS = {"TCP", "UDP", "SCTP"}


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def manifests() -> dict[str, dict[str, Any]]:
    """Every rendered manifest, by its path under k8s/, as committed."""
    names = k8s.render(k8s.RenderSources.of_repo(REPO)).keys()
    return {name: _load(K8S / name) for name in names}


@pytest.fixture(scope="module")
def rayservice(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return manifests[k8s.RAYSERVICE]


@pytest.fixture(scope="module")
def job(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return manifests[k8s.MODELS_JOB]


def _pods(rayservice: dict[str, Any], job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every pod spec an operator's apply creates: each Ray group's, and the Job's."""
    pods = {
        group.get("groupName", "head"): group["template"]["spec"]
        for group in k8s.ray_groups(rayservice)
    }
    return {**pods, "models-job": job["spec"]["template"]["spec"]}


# --- pods ------------------------------------------------------------------------------------


def test_every_pod_runs_non_root_without_privileges_on_a_read_only_root(
    rayservice: dict[str, Any], job: dict[str, Any]
) -> None:
    for name, pod in _pods(rayservice, job).items():
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True, name
        assert (context["runAsUser"], context["runAsGroup"]) == (1000, 100), name
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, name
        (tmp,) = [v for v in pod["volumes"] if v["name"] == pod_security.TMP_VOLUME]
        assert tmp == {"name": "tmp", "emptyDir": {}}, name
        for container in pod["containers"]:
            where = f"{name}/{container['name']}"
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, where
            assert security["privileged"] is False, where
            assert security["capabilities"] == {"drop": ["ALL"]}, where
            assert security["readOnlyRootFilesystem"] is True, where
            mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
            assert mounts["/tmp"]["name"] == "tmp", f"{where}: Ray writes /tmp/ray"
            assert not mounts["/tmp"].get("readOnly"), where


def test_the_autoscaler_sidecar_gets_the_same_container_security(
    rayservice: dict[str, Any],
) -> None:
    options = rayservice["spec"]["rayClusterConfig"]["autoscalerOptions"]
    assert options["securityContext"] == pod_security.container_security_context()
    assert options["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert {"cpu", "memory"} <= options["resources"]["limits"].keys()


def test_every_container_states_its_resources_and_gpus_stay_on_the_gpu_group(
    rayservice: dict[str, Any], job: dict[str, Any]
) -> None:
    for name, pod in _pods(rayservice, job).items():
        for container in pod["containers"]:
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= container["resources"][kind].keys(), name
            if name == "gpu" or name.startswith("gpu-"):  # gpu-<region>: one group per region
                assert container["resources"]["limits"][GPU] == "1"
            else:
                assert GPU not in container["resources"]["limits"], name


def test_only_the_head_keeps_a_service_account_token_for_the_autoscaler(
    rayservice: dict[str, Any], job: dict[str, Any]
) -> None:
    assert rayservice["spec"]["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    for name, pod in _pods(rayservice, job).items():
        assert pod.get("automountServiceAccountToken", True) is (name == "head"), name


def test_dockerfile_runs_every_stage_as_the_pods_numeric_user() -> None:
    stages = re.split(r"^FROM ", (REPO / "Dockerfile").read_text(), flags=re.MULTILINE)[1:]
    assert len(stages) == 2
    for stage in stages:
        users = re.findall(r"^USER (\S+)$", stage, flags=re.MULTILINE)
        assert users, f"stage {stage.split()[0]} never sets USER"
        assert users[-1] == f"{pod_security.RAY_UID}:{pod_security.RAY_GID}"


# --- secrets ---------------------------------------------------------------------------------


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {variable["name"]: variable for variable in container.get("env", [])}


def test_the_router_reads_its_keys_from_the_secret_wherever_it_may_run(
    rayservice: dict[str, Any],
) -> None:
    groups = k8s.ray_groups(rayservice)
    head, workers = groups[0], groups[1:]
    assert not k8s.hosts_replicas(head) and all(k8s.hosts_replicas(g) for g in workers)
    for container in head["template"]["spec"]["containers"]:
        assert not {API_KEYS_FILE_ENV, ADMIN_KEY_ENV, DATABASE_URL_ENV} & _env(container).keys()
    for group in workers:
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            env = _env(container)
            key_file = Path(env[API_KEYS_FILE_ENV]["value"])
            (mount,) = [
                m for m in container["volumeMounts"] if Path(m["mountPath"]) in key_file.parents
            ]
            assert mount["readOnly"] is True
            secret = volumes[mount["name"]]["secret"]
            assert secret["secretName"] == secrets.API_KEYS_FILE.secret
            assert secret["items"] == [{"key": "api-keys", "path": key_file.name}]
            assert secret["defaultMode"] == 0o440
            admin = env[ADMIN_KEY_ENV]["valueFrom"]["secretKeyRef"]
            assert (admin["name"], admin["key"]) == (secrets.ADMIN_KEY.secret, "admin-key")
            database = env[DATABASE_URL_ENV]["valueFrom"]["secretKeyRef"]
            assert database == {"name": "ray-edge-ai-database", "key": "url", "optional": True}


def test_ray_token_auth_uses_the_token_secret(
    rayservice: dict[str, Any], manifests: dict[str, dict[str, Any]]
) -> None:
    auth = rayservice["spec"]["rayClusterConfig"]["authOptions"]
    assert auth == {"mode": "token", "secretName": "ray-edge-ai-ray-token"}
    example = manifests[f"{k8s.EXAMPLES}/ray-token-secret.yaml"]
    assert example["metadata"]["name"] == auth["secretName"]
    # KubeRay reads the token from this key of the Secret.
    assert list(example["stringData"]) == ["auth_token"]


def test_example_secrets_are_core_v1_secrets_with_the_keys_the_pods_read(
    manifests: dict[str, dict[str, Any]],
) -> None:
    examples = {
        doc["metadata"]["name"]: doc
        for name, doc in manifests.items()
        if name.startswith(f"{k8s.EXAMPLES}/")
    }
    assert {name: set(doc["stringData"]) for name, doc in examples.items()} == {
        "ray-edge-ai-ray-token": {"auth_token"},
        "ray-edge-ai-redis": {"password"},
        "ray-edge-ai-api-keys": {"api-keys", "admin-key"},
        "ray-edge-ai-database": {"url"},
    }
    for doc in examples.values():
        assert (doc["apiVersion"], doc["kind"], doc["type"]) == ("v1", "Secret", "Opaque")
        assert set(doc) == {"apiVersion", "kind", "metadata", "type", "stringData"}
        assert all(isinstance(value, str) for value in doc["stringData"].values())


def test_the_example_api_keys_secret_fails_closed(
    manifests: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    example = manifests[f"{k8s.EXAMPLES}/api-keys-secret.yaml"]["stringData"]
    key_file = tmp_path / "api-keys"
    key_file.write_text(example["api-keys"], encoding="utf-8")
    key_file.chmod(0o440)
    environ = {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        API_KEYS_FILE_ENV: str(key_file),
        ADMIN_KEY_ENV: example["admin-key"],
    }
    with pytest.raises(KeyConfigError, match="holds no key"):
        KeyStore.from_env(environ, log=logging.getLogger("test.k8s"))


def test_the_docs_create_the_secrets_the_pods_read() -> None:
    doc = K8S_DOC.read_text()
    assert (
        f"kubectl create secret generic {secrets.RAY_TOKEN.secret} "
        f"--from-literal={secrets.RAY_TOKEN.key}="
    ) in doc
    assert (
        f"kubectl create secret generic {secrets.API_KEYS_FILE.secret} "
        f"--from-file={secrets.API_KEYS_FILE.key}="
    ) in doc
    assert f"--from-literal={secrets.ADMIN_KEY.key}=" in doc
    # The operator commands authenticate to Ray with the token.
    assert "RAY_AUTH_MODE=token" in doc
    assert f"secret {secrets.RAY_TOKEN.secret} -o jsonpath=" in doc


# --- network policies ------------------------------------------------------------------------


def _peers_allowed(policy: dict[str, Any], port: int) -> list[list[dict[str, Any]] | None]:
    """For each ingress rule that opens `port`: its `from` peers (None: from anywhere)."""
    allowed = []
    for rule in policy["spec"]["ingress"]:
        ports = rule.get("ports")
        if ports is None or any(p["port"] == port for p in ports):
            allowed.append(rule.get("from"))
    return allowed


def _check_network_policy_fields(policy: dict[str, Any]) -> None:
    """The fields this project relies on, as networking.k8s.io/v1 defines them."""
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert policy["metadata"]["name"]
    spec = policy["spec"]
    assert set(spec) == {"podSelector", "policyTypes", "ingress"}
    assert set(spec["podSelector"]) == {"matchLabels"} and spec["podSelector"]["matchLabels"]
    assert spec["policyTypes"] == ["Ingress"]
    for rule in spec["ingress"]:
        assert set(rule) <= {"from", "ports"}
        for port in rule.get("ports", []):
            assert isinstance(port["port"], int) and 0 < port["port"] < 65536
            assert port["protocol"] in PROTOCOLS
        for peer in rule.get("from", []):
            assert peer and set(peer) <= PEER_KEYS


def test_network_policy_selects_every_ray_pod(
    rayservice: dict[str, Any], manifests: dict[str, dict[str, Any]]
) -> None:
    policy = manifests[k8s.NETWORK_POLICY]
    _check_network_policy_fields(policy)
    selected = policy["spec"]["podSelector"]["matchLabels"]
    assert selected == k8s.ray_pod_labels(rayservice)
    for group in k8s.ray_groups(rayservice):
        labels = group["template"]["metadata"]["labels"]
        assert selected.items() <= labels.items()
        # KubeRay's own pod label must stay: a template label would replace it.
        assert "app.kubernetes.io/name" not in labels


def test_from_outside_only_the_serve_port_and_metrics_from_monitoring(
    rayservice: dict[str, Any], manifests: dict[str, dict[str, Any]]
) -> None:
    policy = manifests[k8s.NETWORK_POLICY]
    own_pods = [{"podSelector": {"matchLabels": k8s.ray_pod_labels(rayservice)}}]
    head = k8s.ray_groups(rayservice)[0]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert _peers_allowed(policy, ports["serve"]) == [None, own_pods]
    assert _peers_allowed(policy, ports["metrics"]) == [
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        own_pods,
    ]
    (operator,), own = _peers_allowed(policy, ports["dashboard"])
    assert own == own_pods
    assert operator["podSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}
    }
    assert "namespaceSelector" in operator, "the operator, not any pod of the namespace"
    # The GCS, the client server and every worker port: the cluster's own pods only.
    for port in (ports["gcs-server"], ports["client"], 10002, 19999, 52365):
        assert _peers_allowed(policy, port) == [own_pods], port


def test_the_models_job_accepts_no_connection(
    job: dict[str, Any], manifests: dict[str, dict[str, Any]]
) -> None:
    policy = manifests["models-job-networkpolicy.yaml"]
    _check_network_policy_fields(policy)
    assert policy["spec"]["ingress"] == []
    selected = policy["spec"]["podSelector"]["matchLabels"].items()
    assert selected <= job["spec"]["template"]["metadata"]["labels"].items()


# --- the render applies it to every group ----------------------------------------------------


def _render_with_template(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> dict:
    sources = k8s.RenderSources.of_repo(REPO)
    template = _load(sources.templates / k8s.RAYSERVICE)
    edit(template)
    templates = tmp_path / "templates"
    templates.mkdir()
    for path in sources.templates.glob("*.yaml"):
        (templates / path.name).write_text(path.read_text())
    (templates / k8s.RAYSERVICE).write_text(yaml.safe_dump(template, sort_keys=False))
    rendered = k8s.render(dataclasses.replace(sources, templates=templates))
    return yaml.safe_load(rendered[k8s.RAYSERVICE])


def test_a_new_worker_group_gets_all_of_it(tmp_path: Path, rayservice: dict[str, Any]) -> None:
    def add_group(template: dict[str, Any]) -> None:
        groups = template["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        new = copy.deepcopy(groups[-1])
        new["groupName"] = "cpu-eu"
        groups.append(new)

    rendered = _render_with_template(tmp_path, add_group)
    by_name = {g.get("groupName"): g for g in k8s.ray_groups(rendered)}
    # A group is secured by what it is (head, replica host), never by its name.
    assert by_name["cpu-eu"]["template"] == by_name["cpu"]["template"]
    (committed_cpu,) = [g for g in k8s.ray_groups(rayservice) if g.get("groupName") == "cpu"]
    assert by_name["cpu"] == committed_cpu


def test_render_refuses_a_container_without_resources(tmp_path: Path) -> None:
    def drop_limits(template: dict[str, Any]) -> None:
        group = template["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
        del group["template"]["spec"]["containers"][0]["resources"]["limits"]

    # The template's `gpu` group is the prototype of every region's (`gpu-eu`, ...).
    with pytest.raises(ValueError, match=r"worker group 'gpu-eu'.*limits\.cpu, limits\.memory"):
        _render_with_template(tmp_path, drop_limits)


# --- checkov ---------------------------------------------------------------------------------


def _checkov_binary(unavailable: Callable[[str], NoReturn]) -> Path:
    binary = Path(os.environ.get(CHECKOV_ENV) or CHECKOV_DEFAULT)
    if not os.access(binary, os.X_OK):
        unavailable(f"checkov not found at {binary}: run `make checkov` (its own venv)")
    return binary


def _scan_folder(manifests: dict[str, dict[str, Any]], folder: Path) -> None:
    """The manifests as checkov reads them. It knows no RayService, so each Ray group's pod
    template is written as the Pod KubeRay will create from it."""
    for name, document in manifests.items():
        if document["kind"] == "RayService":
            for group in k8s.ray_groups(document):
                pod_name = f"{document['metadata']['name']}-{group.get('groupName', 'head')}"
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": pod_name, **group["template"]["metadata"]},
                    "spec": group["template"]["spec"],
                }
                (folder / f"pod-{pod_name}.yaml").write_text(yaml.safe_dump(pod))
        else:
            (folder / name.replace("/", "-")).write_text(yaml.safe_dump(document))


def _documented_exceptions() -> dict[str, str]:
    """check id -> reason, from docs/kubernetes.md's table of accepted checkov failures."""
    rows = re.findall(r"^\| `(CKV2?_K8S_\d+)`[^|]*\|([^|]+)\|([^|]+)\|$", K8S_DOC.read_text(), re.M)
    return {check: reason.strip() for check, _where, reason in rows}


def test_checkov_finds_nothing_the_docs_do_not_list_with_their_reason(
    manifests: dict[str, dict[str, Any]],
    tmp_path: Path,
    unavailable: Callable[[str], NoReturn],
) -> None:
    checkov = _checkov_binary(unavailable)
    # The rendered manifests and the hand-written ones (the volume claim): all that is applied.
    applied = {
        str(path.relative_to(K8S)): _load(path)
        for path in K8S.rglob("*.yaml")
        if K8S / "templates" not in path.parents
    }
    assert manifests.keys() < applied.keys()
    _scan_folder(applied, tmp_path)
    result = subprocess.run(
        [str(checkov), "-d", str(tmp_path), "--framework", "kubernetes", "-o", "json", "--quiet"],
        capture_output=True,
        text=True,
        timeout=CHECKOV_TIMEOUT_S,
        check=False,
    )
    assert result.returncode in (0, 1), result.stderr[-2000:]  # 1: some check failed
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert sum(r["summary"]["passed"] for r in reports) > 50, "checkov checked next to nothing"
    failed = {
        (check["check_id"], check["resource"])
        for report in reports
        for check in report["results"]["failed_checks"]
    }
    exceptions = _documented_exceptions()
    assert all(len(reason) > 30 for reason in exceptions.values()), "say why, in docs/kubernetes.md"
    unlisted = sorted(
        f"{check} {resource}" for check, resource in failed if check not in exceptions
    )
    assert unlisted == [], "fix these, or list them in docs/kubernetes.md with the reason"
    stale = sorted(set(exceptions) - {check for check, _ in failed})
    assert stale == [], "these no longer fail: remove them from docs/kubernetes.md"
    # Exceptions that hold for some pods only must not spread to the others.
    where = {check: {r for c, r in failed if c == check} for check, _ in failed}
    assert where["CKV_K8S_38"] == {"Pod.default.ray-edge-ai-head"}, "service account token"
    service = yaml.safe_load((REPO / "k8s" / "rayservice.yaml").read_text())
    workers = service["spec"]["rayClusterConfig"]["workerGroupSpecs"]
    # The admin key as an environment variable: on the worker pods (one group per region), only.
    assert where["CKV_K8S_35"] == {f"Pod.default.ray-edge-ai-{g['groupName']}" for g in workers}
    assert not any(r.startswith("Job.") for r in where["CKV_K8S_8"] | where["CKV_K8S_9"])
