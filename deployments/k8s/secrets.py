"""The Secrets ray-edge-ai reads, how the Ray pods get them, and example manifests of them.

- The Ray token (KubeRay `authOptions`): KubeRay gives every Ray container RAY_AUTH_MODE=token
  and RAY_AUTH_TOKEN from this Secret's `auth_token` (KubeRay's key name), and uses it itself to
  talk to the dashboard.
- The Redis password of the GCS's fault tolerance (KubeRay `gcsFaultToleranceOptions`): KubeRay
  hands it to the GCS from this Secret.
- The API keys: a file in a Secret, mounted read-only where the router may run
  (EDGE_API_KEYS_FILE), and the admin key from the same Secret (EDGE_ADMIN_KEY, optional: no
  admin key, no admin API).
- The gateway state's PostgreSQL URL (EDGE_DATABASE_URL, optional), where the router may run:
  its password stays out of serve_config.yaml and the RayService."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deployments.config.state import DATABASE_URL_ENV
from deployments.ingress.security import ADMIN_KEY_ENV, API_KEYS_FILE_ENV
from deployments.k8s.manifest_yaml import FileMode


@dataclass(frozen=True)
class SecretKey:
    """One entry of a Kubernetes Secret."""

    secret: str
    key: str


RAY_TOKEN = SecretKey("ray-edge-ai-ray-token", "auth_token")
REDIS_PASSWORD = SecretKey("ray-edge-ai-redis", "password")
API_KEYS_FILE = SecretKey("ray-edge-ai-api-keys", "api-keys")
ADMIN_KEY = SecretKey("ray-edge-ai-api-keys", "admin-key")
DATABASE_URL = SecretKey("ray-edge-ai-database", "url")
API_KEYS_VOLUME = "api-keys"
API_KEYS_DIR = "/etc/ray-edge-ai/api-keys"
# Owner and group (the pod's fsGroup) may read; nobody may write, others see nothing.
SECRET_FILE_MODE = FileMode(0o440)


def api_keys_file_path() -> str:
    return f"{API_KEYS_DIR}/{API_KEYS_FILE.key}"


def ray_auth_options() -> dict[str, Any]:
    return {"mode": "token", "secretName": RAY_TOKEN.secret}


def redis_password() -> dict[str, Any]:
    return {
        "valueFrom": {"secretKeyRef": {"name": REDIS_PASSWORD.secret, "key": REDIS_PASSWORD.key}}
    }


def mount_api_keys(pod: dict[str, Any]) -> None:
    """Give every container of the pod the key file (read-only; only that entry of the Secret,
    so the admin key is no file) and the admin key as EDGE_ADMIN_KEY."""
    pod.setdefault("volumes", []).append(
        {
            "name": API_KEYS_VOLUME,
            "secret": {
                "secretName": API_KEYS_FILE.secret,
                "items": [{"key": API_KEYS_FILE.key, "path": API_KEYS_FILE.key}],
                "defaultMode": SECRET_FILE_MODE,
            },
        }
    )
    for container in pod["containers"]:
        container.setdefault("volumeMounts", []).append(
            {"name": API_KEYS_VOLUME, "mountPath": API_KEYS_DIR, "readOnly": True}
        )
        container.setdefault("env", []).extend(
            [
                {"name": API_KEYS_FILE_ENV, "value": api_keys_file_path()},
                {
                    "name": ADMIN_KEY_ENV,
                    "valueFrom": {
                        "secretKeyRef": {
                            "name": ADMIN_KEY.secret,
                            "key": ADMIN_KEY.key,
                            "optional": True,
                        }
                    },
                },
            ]
        )


def database_url_env(pod: dict[str, Any]) -> None:
    """Give every container of the pod EDGE_DATABASE_URL from the database Secret. Optional:
    without the Secret the router keeps its state in SQLite, one file per pod (and warns)."""
    for container in pod["containers"]:
        container.setdefault("env", []).append(
            {
                "name": DATABASE_URL_ENV,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": DATABASE_URL.secret,
                        "key": DATABASE_URL.key,
                        "optional": True,
                    }
                },
            }
        )


def _secret(name: str, string_data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "ray-edge-ai"}},
        "type": "Opaque",
        "stringData": string_data,
    }


def example_secrets() -> dict[str, dict[str, Any]]:
    """File name -> an example Secret. Applied as they are, they fail closed: an empty Ray token
    stops Ray from starting, a key file with no key stops the router, no admin key means no
    admin API, an empty Redis password is refused by a Redis that requires one, an empty
    database URL leaves gateway state in SQLite per pod. The `kubectl
    create secret` commands of docs/kubernetes.md make real ones."""
    return {
        "ray-token-secret.yaml": _secret(RAY_TOKEN.secret, {RAY_TOKEN.key: ""}),
        "redis-password-secret.yaml": _secret(REDIS_PASSWORD.secret, {REDIS_PASSWORD.key: ""}),
        "api-keys-secret.yaml": _secret(
            API_KEYS_FILE.secret,
            {
                API_KEYS_FILE.key: "# one `[name:]key` per line, e.g. team-a:sk-<random>\n",
                ADMIN_KEY.key: "",
            },
        ),
        "database-secret.yaml": _secret(
            DATABASE_URL.secret,
            {DATABASE_URL.key: ""},  # postgresql://user:password@host:5432/database
        ),
    }
