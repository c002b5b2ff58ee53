"""The RayService: serve_config.yaml as its serveConfigV2, the cluster's shape from the template,
and on every Ray pod the same security: token auth, non-root hardened containers, the API keys
and the Redis password where the router may run. Groups are handled by what they are (head,
replica hosts), never by name, so a new worker group gets all of it."""

from __future__ import annotations

import contextlib
import copy
import tomllib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from deployments.config import parse_app_config, serve_switches
from deployments.k8s import (
    high_availability,
    pod_security,
    region_groups,
    response_cache,
    secrets,
)
from deployments.k8s.manifest_yaml import dump_yaml
from deployments.serve_file import set_router_listener

MODELS_VOLUME = "models"
# An idle GPU node is kept for the longest Serve downscale delay plus this: a burst shortly after
# a scale-down still finds the node (a new one takes minutes to provision).
IDLE_MARGIN_S = 60
# Ray Serve's HTTP port when serve_config.yaml does not set http_options.port.
SERVE_DEFAULT_PORT = 8000
# Every Ray pod carries these labels (KubeRay keeps template labels) and the NetworkPolicy selects
# on them; KubeRay's own `app.kubernetes.io/name: kuberay` stays untouched.
PART_OF_LABEL = "app.kubernetes.io/part-of"
COMPONENT_LABEL = "app.kubernetes.io/component"
RAY_POD_COMPONENT = "ray"
SERVE_CONFIG_HEADER = (
    "# GENERATED from serve_config.yaml by `python -m deployments.k8s render`: edit that file.\n"
)


@dataclass(frozen=True)
class Pins:
    """What pyproject.toml pins: image tags and rayVersion follow it."""

    project_version: str
    ray_version: str

    @classmethod
    def from_pyproject(cls, path: Path) -> Pins:
        project = tomllib.loads(path.read_text())["project"]
        # Ray is pinned in the `serve` extra (the simulator alone needs no Ray).
        extras = project.get("optional-dependencies", {})
        for requirement in [*project["dependencies"], *extras.get("serve", [])]:
            name, sep, version = requirement.partition("==")
            if sep and name.split("[")[0].strip() == "ray":
                return cls(project_version=project["version"], ray_version=version.strip())
        raise ValueError(f"{path}: no pinned ray==X dependency")

    def image_tag(self, variant: str) -> str:
        return f"{self.project_version}-ray{self.ray_version}-{variant}"


@contextlib.contextmanager
def _without_serve_advice() -> Iterator[None]:
    """Serve's FutureWarnings about a config are Serve's to give when it is deployed."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def largest_downscale_delay_s(serve_config: dict[str, Any]) -> float:
    """The longest any deployment keeps an idle replica, with Ray Serve's own defaults filled in
    (a downscale_to_zero_delay_s left unset means downscale_delay_s)."""
    from ray.serve.config import AutoscalingConfig  # pydantic only; starts nothing

    delays = [0.0]
    for app in serve_config.get("applications", []):
        for deployment in app.get("deployments", []):
            if "autoscaling_config" not in deployment:
                continue
            with _without_serve_advice():
                autoscaling = AutoscalingConfig(**deployment["autoscaling_config"])
            delays.append(autoscaling.downscale_delay_s)
            if autoscaling.downscale_to_zero_delay_s is not None:
                delays.append(autoscaling.downscale_to_zero_delay_s)
    return max(delays)


def autoscaler_idle_timeout_s(serve_config: dict[str, Any]) -> int:
    return int(largest_downscale_delay_s(serve_config)) + IDLE_MARGIN_S


def serve_port(serve_config: dict[str, Any]) -> int:
    return int(serve_config.get("http_options", {}).get("port", SERVE_DEFAULT_PORT))


def k8s_serve_config(
    serve_config: dict[str, Any], models_dir: str, redis_address: str
) -> dict[str, Any]:
    """serve_config.yaml with the settings that differ on Kubernetes (host, a proxy on every
    node, accelerator, models_dir, region placement, the response cache in `redis_address`, no
    routers' own port); all else unchanged."""
    from ray.serve.schema import ServeDeploySchema

    config = copy.deepcopy(serve_config)
    # Pods are reached through the serve Service, never on localhost.
    config.setdefault("http_options", {})["host"] = "0.0.0.0"
    high_availability.serve_on_every_node(config)
    for app in config["applications"]:
        # `auto` would look for GPUs when the app is built, when the GPU group may be at zero.
        app["args"]["accelerator"] = "gpu"
        app["args"]["models_dir"] = models_dir
        region_groups.pin_to_region_groups(app["args"])
        response_cache.share_across_pods(app["args"], redis_address)
        # The serve Service reaches the pods whose proxy KubeRay finds healthy; the routers' own
        # port has no such check (a pod without a router replica refuses it), so it stays off.
        set_router_listener(app["args"], None)
        parse_app_config(app["args"])  # fail the render, not the cluster, on a bad config
    with _without_serve_advice():
        ServeDeploySchema.model_validate(config)  # what KubeRay will submit: Serve's own schema
    return config


def ray_groups(rayservice: dict[str, Any]) -> list[dict[str, Any]]:
    """The head group, then every worker group."""
    cluster = rayservice["spec"]["rayClusterConfig"]
    return [cluster["headGroupSpec"], *cluster.get("workerGroupSpecs", [])]


def _ray_pods(rayservice: dict[str, Any]) -> list[dict[str, Any]]:
    return [group["template"]["spec"] for group in ray_groups(rayservice)]


def hosts_replicas(group: dict[str, Any]) -> bool:
    """Serve may place a replica (the router among them) in this group's pods: they offer CPUs."""
    return str(group.get("rayStartParams", {}).get("num-cpus", "")) != "0"


def ray_pod_labels(rayservice: dict[str, Any]) -> dict[str, str]:
    return {PART_OF_LABEL: rayservice["metadata"]["name"], COMPONENT_LABEL: RAY_POD_COMPONENT}


def head_port(rayservice: dict[str, Any], name: str) -> int:
    """The number of a named container port of the head's Ray container."""
    head = ray_groups(rayservice)[0]["template"]["spec"]["containers"][0]
    ports = {port["name"]: port["containerPort"] for port in head.get("ports", [])}
    if name not in ports:
        raise ValueError(f"the head container declares no port named {name!r}: {sorted(ports)}")
    return int(ports[name])


def models_mount_path(rayservice: dict[str, Any]) -> str:
    """Where the pods mount the model volume: the serve config's models_dir follows it."""
    paths = {
        mount["mountPath"]
        for pod in _ray_pods(rayservice)
        for container in pod["containers"]
        for mount in container.get("volumeMounts", [])
        if mount["name"] == MODELS_VOLUME
    }
    if len(paths) != 1:
        raise ValueError(f"the template must mount volume {MODELS_VOLUME!r} at one path: {paths}")
    return paths.pop()


def _label_pods(group: dict[str, Any], labels: dict[str, str]) -> None:
    """Add the labels to the group's pod template (metadata first, as manifests order it)."""
    template = group["template"]
    metadata = template.pop("metadata", {})
    metadata["labels"] = {**metadata.get("labels", {}), **labels}
    group["template"] = {"metadata": metadata, **template}


def _finish_group(
    group: dict[str, Any],
    where: str,
    *,
    labels: dict[str, str],
    kubernetes_api: bool,
    pins: Pins,
    switches: dict[str, str],
) -> None:
    """One group's pods: labelled for the NetworkPolicy, hardened, given the API keys, the
    response cache's Redis password and the database URL where the router may run, on the pinned
    serving image, with the serve config's Ray Serve switches (a Serve that KubeRay starts may not
    inherit them from the config's controller_options)."""
    _label_pods(group, labels)
    pod = group["template"]["spec"]
    pod_security.require_resources(pod, where)
    pod_security.secure_pod(pod, kubernetes_api=kubernetes_api)
    if hosts_replicas(group):
        secrets.mount_api_keys(pod)
        response_cache.give_redis_password(pod)
        secrets.database_url_env(pod)
    for container in pod["containers"]:
        repository = container["image"].rsplit(":", 1)[0]
        container["image"] = f"{repository}:{pins.image_tag('gpu')}"
        container.setdefault("env", []).extend(
            {"name": name, "value": value} for name, value in switches.items()
        )


def build_rayservice(
    serve_config: dict[str, Any], template: dict[str, Any], pins: Pins
) -> dict[str, Any]:
    rayservice = copy.deepcopy(template)
    cluster = rayservice["spec"]["rayClusterConfig"]
    serve = k8s_serve_config(
        serve_config, models_mount_path(template), high_availability.gcs_redis_address(cluster)
    )
    if head_port(rayservice, "serve") != serve_port(serve):
        raise ValueError(
            f"the head's `serve` port ({head_port(rayservice, 'serve')}) must be "
            f"serve_config.yaml's http_options.port ({serve_port(serve)})"
        )
    rayservice["spec"]["serveConfigV2"] = SERVE_CONFIG_HEADER + dump_yaml(serve)
    cluster["rayVersion"] = pins.ray_version
    # The GCS, the dashboard and its Jobs API (which runs any code by design) take the token.
    cluster["authOptions"] = secrets.ray_auth_options()
    high_availability.enable_gcs_fault_tolerance(cluster)
    autoscaler = cluster["autoscalerOptions"]
    autoscaler["idleTimeoutSeconds"] = autoscaler_idle_timeout_s(serve_config)
    pod_security.secure_autoscaler(autoscaler)
    regions = region_groups.regions_of(serve_config)
    if regions:
        region_groups.split_region_groups(cluster, regions)
    # Every group, whether written in the template or generated, is finished the same way.
    labels = ray_pod_labels(rayservice)
    for group in ray_groups(rayservice):
        is_head = group is cluster["headGroupSpec"]
        # The head's autoscaler sidecar scales the cluster through the Kubernetes API.
        needs_api = is_head and bool(cluster.get("enableInTreeAutoscaling"))
        where = "the head group" if is_head else f"worker group {group['groupName']!r}"
        high_availability.expose_serve_port(group, serve_port(serve))
        _finish_group(
            group,
            where,
            labels=labels,
            kubernetes_api=needs_api,
            pins=pins,
            switches=serve_switches(serve_config),
        )
    return rayservice
