"""What `python -m deployments.k8s render` writes, and from what: the RayService, the
NetworkPolicy and the models Job from serve_config.yaml and k8s/templates/, example Secrets from
the names the pods read them by."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from deployments.config import PROJECT_ROOT
from deployments.k8s.manifest_yaml import dump_yaml, generated_header
from deployments.k8s.models_job import build_models_job, build_models_job_network_policy
from deployments.k8s.network_policy import build_network_policy
from deployments.k8s.rayservice import Pins, build_rayservice
from deployments.k8s.secrets import example_secrets

RAYSERVICE = "rayservice.yaml"
NETWORK_POLICY = "networkpolicy.yaml"
MODELS_JOB = "models-job.yaml"
MODELS_JOB_NETWORK_POLICY = "models-job-networkpolicy.yaml"
# Not applied by `kubectl apply -f k8s/`, which does not descend into folders.
EXAMPLES = "examples"


@dataclass(frozen=True)
class RenderSources:
    """The files a render reads, and the folder it writes."""

    serve_config: Path
    templates: Path
    pyproject: Path
    out_dir: Path

    @classmethod
    def of_repo(cls, root: Path = PROJECT_ROOT) -> RenderSources:
        return cls(
            serve_config=root / "serve_config.yaml",
            templates=root / "k8s" / "templates",
            pyproject=root / "pyproject.toml",
            out_dir=root / "k8s",
        )


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def render(sources: RenderSources) -> dict[str, str]:
    """Manifest path (relative to the output folder) -> its text."""
    serve_config = _load(sources.serve_config)
    pins = Pins.from_pyproject(sources.pyproject)
    rayservice = build_rayservice(serve_config, _load(sources.templates / RAYSERVICE), pins)
    job = build_models_job(_load(sources.templates / MODELS_JOB), pins)
    job_template = f"k8s/templates/{MODELS_JOB}"
    policy = build_network_policy(_load(sources.templates / NETWORK_POLICY), rayservice)
    manifests = {
        RAYSERVICE: generated_header("serve_config.yaml", f"k8s/templates/{RAYSERVICE}")
        + dump_yaml(rayservice),
        NETWORK_POLICY: generated_header(
            f"k8s/templates/{NETWORK_POLICY}", f"k8s/templates/{RAYSERVICE}"
        )
        + dump_yaml(policy),
        MODELS_JOB: generated_header(job_template, "pyproject.toml") + dump_yaml(job),
        MODELS_JOB_NETWORK_POLICY: generated_header(job_template)
        + dump_yaml(build_models_job_network_policy(job)),
    }
    for name, secret in example_secrets().items():
        manifests[f"{EXAMPLES}/{name}"] = (
            generated_header("deployments/k8s/secrets.py")
            + "# An EXAMPLE of the shape: make the real one with docs/kubernetes.md's `kubectl"
            " create secret`.\n" + dump_yaml(secret)
        )
    return manifests
