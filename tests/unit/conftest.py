"""Unit tests never start Ray: any attempt fails loudly. They run as off Kubernetes, even in a CI
pod: the router's open-mode refusal there is tested with an explicit environment."""

from __future__ import annotations

import pytest


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
