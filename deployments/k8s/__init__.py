"""The Kubernetes manifests of k8s/, generated so they never drift from serve_config.yaml (the
one source of truth for the application) and the templates in k8s/templates/:
`python -m deployments.k8s render` writes them, `--check` fails when a committed one is stale.

rayservice: the RayService (serve config, cluster shape, token auth, hardened pods);
network_policy: who may reach the Ray pods; secrets: the Secrets the pods read and examples of
them; models_job: the Job that fills the models volume; pod_security: the container and pod
security every pod gets; render and cli: the files."""

from deployments.k8s.cli import main
from deployments.k8s.rayservice import (
    MODELS_VOLUME,
    Pins,
    autoscaler_idle_timeout_s,
    build_rayservice,
    hosts_replicas,
    k8s_serve_config,
    largest_downscale_delay_s,
    models_mount_path,
    ray_groups,
    ray_pod_labels,
)
from deployments.k8s.render import (
    EXAMPLES,
    MODELS_JOB,
    NETWORK_POLICY,
    RAYSERVICE,
    RenderSources,
    render,
)

__all__ = [
    "EXAMPLES",
    "MODELS_JOB",
    "MODELS_VOLUME",
    "NETWORK_POLICY",
    "RAYSERVICE",
    "Pins",
    "RenderSources",
    "autoscaler_idle_timeout_s",
    "build_rayservice",
    "hosts_replicas",
    "k8s_serve_config",
    "largest_downscale_delay_s",
    "main",
    "models_mount_path",
    "ray_groups",
    "ray_pod_labels",
    "render",
]
