"""The NetworkPolicy of the Ray pods: who may open a connection to them. The template names the
outside peers (the monitoring and KubeRay operator namespaces) and the ports they may reach, by
the head container's port names; the render selects the Ray pods, turns port names into numbers,
and adds the one rule that lets the cluster's own pods reach each other on every port (the GCS,
dashboard, client, worker and object-transfer ports are for them only)."""

from __future__ import annotations

import copy
from typing import Any

from deployments.k8s.rayservice import head_port, ray_pod_labels


def _numbered(port: dict[str, Any], rayservice: dict[str, Any]) -> dict[str, Any]:
    number = port["port"]
    if isinstance(number, str):
        number = head_port(rayservice, number)
    return {**port, "port": number, "protocol": port.get("protocol", "TCP")}


def build_network_policy(template: dict[str, Any], rayservice: dict[str, Any]) -> dict[str, Any]:
    policy = copy.deepcopy(template)
    spec = policy["spec"]
    if spec.get("policyTypes") != ["Ingress"]:
        raise ValueError("the NetworkPolicy template must have policyTypes: [Ingress]")
    labels = ray_pod_labels(rayservice)
    spec["podSelector"] = {"matchLabels": labels}
    rules = []
    for index, rule in enumerate(spec.get("ingress", [])):
        if not rule.get("ports"):
            # A rule with no ports opens every port: only the cluster's own rule may.
            raise ValueError(f"NetworkPolicy template, ingress rule {index + 1}: list its ports")
        rules.append({**rule, "ports": [_numbered(port, rayservice) for port in rule["ports"]]})
    rules.append({"from": [{"podSelector": {"matchLabels": labels}}]})
    spec["ingress"] = rules
    return policy
