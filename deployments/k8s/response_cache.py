"""On Kubernetes the router replicas run in different pods, so the response cache they share is a
Redis: serve_config.yaml's `sqlite` (one file per node) becomes `redis` at the GCS's Redis unless
the config names another, and the pods where a router may run read its password from the
ray-edge-ai-redis Secret (EDGE_REDIS_PASSWORD). `memory` or a disabled cache stays as it is."""

from __future__ import annotations

from typing import Any

from deployments.ingress.cache import REDIS_PASSWORD_ENV
from deployments.k8s import secrets


def share_across_pods(app_args: dict[str, Any], redis_address: str) -> None:
    cache = app_args.setdefault("router", {}).setdefault("cache", {})
    if cache.get("enabled") is False or cache.get("backend") == "memory":
        return
    cache["backend"] = "redis"
    # KubeRay takes a bare host:port as the GCS's address; the Redis client wants a URL.
    cache.setdefault(
        "redis_url", redis_address if "://" in redis_address else f"redis://{redis_address}"
    )


def give_redis_password(pod: dict[str, Any]) -> None:
    for container in pod["containers"]:
        container.setdefault("env", []).append(
            {"name": REDIS_PASSWORD_ENV, **secrets.redis_password()}
        )
