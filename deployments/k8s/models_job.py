"""The Job that fills the models volume: the template's, with the CPU image of the pinned
release and the same pod security as the Ray pods (the volume is its one writable mount besides
/tmp), and a NetworkPolicy that lets nothing connect to it (it serves nothing)."""

from __future__ import annotations

import copy
from typing import Any

from deployments.k8s import pod_security
from deployments.k8s.rayservice import Pins


def build_models_job(template: dict[str, Any], pins: Pins) -> dict[str, Any]:
    job = copy.deepcopy(template)
    pod = job["spec"]["template"]["spec"]
    pod_security.require_resources(pod, "the models Job")
    pod_security.secure_pod(pod, kubernetes_api=False)
    for container in pod["containers"]:
        repository = container["image"].rsplit(":", 1)[0]
        container["image"] = f"{repository}:{pins.image_tag('cpu')}"
    return job


def build_models_job_network_policy(job: dict[str, Any]) -> dict[str, Any]:
    labels = dict(job["spec"]["template"]["metadata"]["labels"])
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{job['metadata']['name']}-no-ingress",
            "labels": dict(job["metadata"].get("labels", {})),
        },
        "spec": {"podSelector": {"matchLabels": labels}, "policyTypes": ["Ingress"], "ingress": []},
    }
