"""The admin API with edge-control gone or hung (no Ray): a 503 in the API's error shape that
names it, never a 500; the colo view shows what the router last applied."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi.testclient import TestClient
from ray.exceptions import ActorDiedError
from router_fakes import app_config, fake_handles, services_for

from deployments.errors import RegionNotFoundError
from deployments.ingress.api.app import make_app
from deployments.ingress.serving import drills

ADMIN_KEY = "sk-admin-0123456789abcdef"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
ENV = {"EDGE_API_KEYS": "alice:sk-user-0123456789abcdef", "EDGE_ADMIN_KEY": ADMIN_KEY}


class GoneControl:
    """edge-control's handle with its replica dead (`how="died"`), hung (`"hung"`), or raising
    one of our own errors (`"refuses"`): every method the same."""

    def __init__(self, how: str):
        self.how = how

    def __getattr__(self, method: str) -> Any:
        return self

    def remote(self, *args: Any) -> Any:
        return self._call()

    async def _call(self) -> Any:
        if self.how == "died":
            raise ActorDiedError()
        if self.how == "refuses":
            raise RegionNotFoundError("no such region at edge-control", param="region")
        await asyncio.Event().wait()  # never answers


def client_with(control: GoneControl) -> TestClient:
    config = app_config()
    services = services_for(config, fake_handles(), ENV, control=control)
    return TestClient(make_app(config, services), raise_server_exceptions=False)


@pytest.fixture
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drills, "CONTROL_TIMEOUT_S", 0.05)


@pytest.mark.parametrize("how", ["died", "hung"])
def test_edge_control_gone_is_a_503_naming_it(how: str, short_wait: None) -> None:
    with client_with(GoneControl(how)) as client:
        for method, path, body, asked in (
            ("GET", "/admin/regions", None, "regions"),
            ("POST", "/admin/regions/eu/faults", {"down": True}, "set_region_fault"),
            ("DELETE", "/admin/regions/eu/faults", None, "clear_region_faults"),
            ("POST", "/admin/colos/LHR/faults", {"down": True}, "set_fault"),
        ):
            reply = client.request(method, path, json=body, headers=ADMIN)
            assert reply.status_code == 503, (path, reply.text)
            error = reply.json()["error"]
            assert error["code"] == "control_unavailable" and "edge-control" in error["message"]
            assert f"did not answer {asked} " in error["message"]  # the method it called
            assert reply.headers["retry-after"] == "1"


@pytest.mark.parametrize("how", ["died", "hung"])
def test_the_colo_view_without_edge_control_is_the_last_applied(how: str, short_wait: None):
    with client_with(GoneControl(how)) as client:
        colos = client.get("/admin/colos", headers=ADMIN)
        assert colos.status_code == 200
        assert {colo["id"] for colo in colos.json()} >= {"LHR"}


def test_edge_controls_own_errors_keep_their_status(short_wait: None) -> None:
    with client_with(GoneControl("refuses")) as client:
        reply = client.get("/admin/regions", headers=ADMIN)
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "region_not_found"
