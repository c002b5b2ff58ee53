"""No single point of failure on Kubernetes, as KubeRay advises for a RayService: the GCS keeps
its state in an external Redis (`gcsFaultToleranceOptions`), so a head pod's restart neither
loses the cluster's state nor takes the worker pods' replicas with it, and Serve runs an HTTP
proxy on every node (`proxy_location: EveryNode`), so the serve Service, which KubeRay points at
every pod whose proxy is healthy, still has a way in while the head is gone."""

from __future__ import annotations

from typing import Any

from deployments.k8s import secrets

EVERY_NODE = "EveryNode"
SERVE_PORT_NAME = "serve"


def serve_on_every_node(serve_config: dict[str, Any]) -> None:
    """Off Kubernetes, serve_config.yaml keeps one proxy (on one machine every node would
    share the host's port); in pods each node has its own address."""
    serve_config["proxy_location"] = EVERY_NODE


def gcs_redis_address(cluster: dict[str, Any]) -> str:
    """The Redis the template names for the GCS's state."""
    address = (cluster.get("gcsFaultToleranceOptions") or {}).get("redisAddress")
    if not address:
        raise ValueError(
            "k8s/templates/rayservice.yaml: rayClusterConfig.gcsFaultToleranceOptions."
            "redisAddress must name the Redis the GCS keeps its state in (without it, losing "
            "the head pod loses every replica of the cluster)"
        )
    return str(address)


def enable_gcs_fault_tolerance(cluster: dict[str, Any]) -> None:
    """The template names the Redis; its password always comes from the Secret."""
    gcs_redis_address(cluster)
    options = cluster["gcsFaultToleranceOptions"]
    if "redisPassword" in options:
        raise ValueError(
            "k8s/templates/rayservice.yaml: leave gcsFaultToleranceOptions.redisPassword out: "
            f"the render takes it from the Secret {secrets.REDIS_PASSWORD.secret!r} "
            f"(key {secrets.REDIS_PASSWORD.key!r}), never a value in the manifest"
        )
    cluster["gcsFaultToleranceOptions"] = {**options, "redisPassword": secrets.redis_password()}


def expose_serve_port(group: dict[str, Any], port: int) -> None:
    """The group's Ray container declares the proxy's port, as the head's does."""
    container = group["template"]["spec"]["containers"][0]
    ports = container.setdefault("ports", [])
    if not any(entry.get("name") == SERVE_PORT_NAME for entry in ports):
        ports.append({"name": SERVE_PORT_NAME, "containerPort": port})
