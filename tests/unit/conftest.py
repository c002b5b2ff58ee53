"""Unit tests never start Ray: any attempt fails loudly. They run as off Kubernetes, even in a CI
pod: the router's open-mode refusal there is tested with an explicit environment."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import NoReturn

import pytest


@pytest.fixture(scope="session")
def unavailable() -> Callable[[str], NoReturn]:
    """For a test whose outside input (KubeRay's CRDs, the checkov venv) is missing: skip with the
    one-line reason on a developer's machine, fail under CI (CI=true), which must provide it."""

    def _missing(reason: str) -> NoReturn:
        if os.environ.get("CI", "").strip().lower() in ("true", "1"):
            pytest.fail(reason)
        pytest.skip(reason)

    return _missing


@pytest.fixture(autouse=True)
def _forbid_ray_init(monkeypatch: pytest.MonkeyPatch) -> None:
    def _refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("unit tests must not start Ray; move this test to tests/integration")

    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a hard dependency
        return
    monkeypatch.setattr(ray, "init", _refuse)


@pytest.fixture(autouse=True)
def _off_kubernetes(monkeypatch: pytest.MonkeyPatch) -> None:
    from deployments.ingress.security import KUBERNETES_ENV

    monkeypatch.delenv(KUBERNETES_ENV, raising=False)
