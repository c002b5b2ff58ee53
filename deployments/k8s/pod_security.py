"""The security every pod of ray-edge-ai runs with: non-root (the image's numeric user), no
privilege escalation, no Linux capabilities, the runtime's default seccomp profile, a read-only
root filesystem with a writable /tmp (Ray keeps its session, logs and sockets in /tmp/ray), and
resource requests and limits on every container."""

from __future__ import annotations

from typing import Any

# The user `ray` of the rayproject/ray images and its group `users`; the Dockerfile ends each
# stage with `USER 1000:100` (tests/unit/test_k8s_security.py holds the two together). Numeric,
# so the kubelet can verify runAsNonRoot.
RAY_UID = 1000
RAY_GID = 100
TMP_VOLUME = "tmp"
TMP_PATH = "/tmp"
# A tag may be pushed again (a rebuilt image): always ask the registry which image it names.
IMAGE_PULL_POLICY = "Always"
REQUIRED_RESOURCES = ("cpu", "memory")


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RAY_UID,
        "runAsGroup": RAY_GID,
        # Group of the mounted Secret files (mode 0440) and of the models volume...
        "fsGroup": RAY_GID,
        # ...changed only when the volume's root is not already ours: a models volume of many
        # GiB is not walked file by file at every pod start.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _tmp_mount() -> dict[str, Any]:
    return {"name": TMP_VOLUME, "mountPath": TMP_PATH}


def secure_pod(pod: dict[str, Any], *, kubernetes_api: bool) -> None:
    """Harden a pod spec in place: every container, and the pod itself. `kubernetes_api`: some
    container of it calls the Kubernetes API (KubeRay's autoscaler), so it keeps its service
    account token; every other pod goes without."""
    pod["securityContext"] = pod_security_context()
    if not kubernetes_api:
        pod["automountServiceAccountToken"] = False
    volumes = pod.setdefault("volumes", [])
    if not any(volume["name"] == TMP_VOLUME for volume in volumes):
        volumes.append({"name": TMP_VOLUME, "emptyDir": {}})
    for container in pod["containers"]:
        container["imagePullPolicy"] = IMAGE_PULL_POLICY
        container["securityContext"] = container_security_context()
        mounts = container.setdefault("volumeMounts", [])
        if not any(mount["mountPath"] == TMP_PATH for mount in mounts):
            mounts.append(_tmp_mount())


def secure_autoscaler(options: dict[str, Any]) -> None:
    """KubeRay's autoscaler sidecar, which the operator adds to the head pod from these options:
    the same container security, and the head pod's /tmp."""
    options["securityContext"] = container_security_context()
    options["volumeMounts"] = [_tmp_mount()]
    require_container_resources(options, "autoscalerOptions")


def require_container_resources(container: dict[str, Any], where: str) -> None:
    resources = container.get("resources", {})
    missing = [
        f"{kind}.{name}"
        for kind in ("requests", "limits")
        for name in REQUIRED_RESOURCES
        if name not in resources.get(kind, {})
    ]
    if missing:
        raise ValueError(f"{where}: resources must set {', '.join(missing)}")


def require_resources(pod: dict[str, Any], where: str) -> None:
    """Every container states what it needs and may use: the scheduler places it by its
    requests, and a limit keeps one runaway replica from starving its node."""
    for container in pod["containers"]:
        require_container_resources(container, f"{where}, container {container['name']!r}")
