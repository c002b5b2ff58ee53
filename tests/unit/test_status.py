"""`edge status` from a recorded Ray dashboard answer, /readyz and /admin/colos JSON, and from the
admin state the real EdgeNetwork produces."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console

from edge_sim.clock import ManualClock
from edge_sim.config import EdgeConfig
from edge_sim.faults import ColoFault
from edge_sim.geo import CountryCentroids
from edge_sim.network import EdgeNetwork
from edgectl.cli import main

ADMIN_KEY = "ops-key"
NOW_UNIX_S = 1_750_000_000.0
SERVE_APPLICATIONS = json.loads(
    (Path(__file__).parent / "data" / "serve_applications.json").read_text()
)
COLOS = [
    {
        "id": "FRA",
        "city": "Frankfurt",
        "lat": 50.04,
        "lon": 8.56,
        "models": "*",
        "healthy": False,
        "faults": [
            {"down": True, "added_latency_ms": 0, "error_rate": 0, "active": True,
             "starts_in_s": 0, "ends_in_s": None},
        ],
    },
    {
        "id": "AMS",
        "city": "Amsterdam",
        "lat": 52.31,
        "lon": 4.77,
        "models": ["glm", "embedding"],
        "healthy": True,
        "faults": [
            {"down": False, "added_latency_ms": 150.0, "error_rate": 0.25, "active": False,
             "starts_in_s": 30.0, "ends_in_s": 90.0},
        ],
    },
    {"id": "NRT", "city": "Tokyo", "lat": 35.77, "lon": 140.39, "models": "*", "healthy": False,
     "status": "planned", "faults": []},
]  # fmt: skip


def router(
    readyz_models: dict[str, Any],
    colos: list[dict[str, Any]] = COLOS,
    dashboard: Callable[[httpx.Request], httpx.Response] | None = None,
) -> httpx.MockTransport:
    """The router at router.test and Ray's dashboard at dash.test."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.host == "dash.test":
            if dashboard is not None:
                return dashboard(request)
            assert request.url.path == "/api/serve/applications/"
            return httpx.Response(200, json=SERVE_APPLICATIONS)
        if request.url.path == "/readyz":
            return httpx.Response(200, json={"ready": ["glm"], "models": readyz_models})
        if request.url.path == "/admin/colos":
            if request.headers.get("authorization") != f"Bearer {ADMIN_KEY}":
                return httpx.Response(401, json={"error": {"message": "bad key"}})
            return httpx.Response(200, json=colos)
        return httpx.Response(404)

    return httpx.MockTransport(handle)


def run_ops(transport: httpx.BaseTransport, *, admin_key: str = ADMIN_KEY) -> tuple[int, str]:
    console = Console(record=True, width=160, color_system=None)
    code = main(
        ["status", "--url", "http://router.test", "--dashboard", "http://dash.test",
         "--admin-key", admin_key],
        transport=transport,
        console=console,
        wall_clock=lambda: NOW_UNIX_S,
    )  # fmt: skip
    return code, console.export_text()


def row(text: str, first_cell: str) -> str:
    return next(line for line in text.splitlines() if line.strip("│ ").startswith(first_cell))


def test_status_shows_replicas_queues_and_cold_starts() -> None:
    readyz = {
        "glm": {"status": "UPSCALING", "running_replicas": 1, "in_flight": 3, "queued": 5,
                "last_cold_start": {"at_unix": NOW_UNIX_S - 42, "wait_ms": 4200.0,
                                    "replica_load_s": 3.1, "phases": None}},
        "kimi": {"status": "HEALTHY", "running_replicas": 0, "last_cold_start": None},
    }  # fmt: skip
    code, text = run_ops(router(readyz))
    assert code == 0
    assert "Application edge: RUNNING" in text
    glm = row(text, "glm")
    for cell in ("UPSCALING", "1 / 2", "RUNNING 1, STARTING 1", "in flight 3, queued 5",
                 "42 s ago, waited 4.2 s (model load 3.1 s)"):  # fmt: skip
        assert cell in glm
    kimi = row(text, "kimi")
    assert "0 / 0" in kimi and "n/a" in kimi and "none since the router started" in kimi
    assert "1 / 1" in row(text, "router")
    assert "last cold start unknown" not in text


def test_status_shows_colo_health_faults_and_traffic() -> None:
    code, text = run_ops(router({"glm": {}}))
    assert code == 0
    fra, ams, nrt = row(text, "FRA"), row(text, "AMS"), row(text, "NRT")
    assert "down" in fra and "up" not in fra
    assert "up" in ams and "down" not in ams
    assert "+150 ms 25% errors in 30 s" in ams and "glm, embedding" in ams
    assert "down (planned)" in nrt
    assert "1/3 colos up" in text
    # A router that does not report cold starts: said once, not guessed.
    assert "last cold start unknown: this router does not report it" in text
    assert "unknown" in row(text, "glm")


def test_status_renders_the_admin_state_the_edge_network_produces() -> None:
    clock = ManualClock()
    config = EdgeConfig.model_validate(
        {
            "topology": {
                "colos": [
                    {"id": "AAA", "city": "A", "country": "GH", "lat": 0.0, "lon": 0.0},
                    {"id": "BBB", "city": "B", "country": "GH", "lat": 0.0, "lon": 1.0},
                ]
            }
        }
    )
    network = EdgeNetwork(config, clock=clock, centroids=CountryCentroids({}))
    network.set_fault("AAA", ColoFault(down=True, duration_s=60))
    network.set_fault("BBB", ColoFault(added_latency_ms=80, start_after_s=10))
    colos = json.loads(json.dumps(network.colo_states()))
    code, text = run_ops(router({}, colos))
    assert code == 0
    aaa, bbb = row(text, "AAA"), row(text, "BBB")
    assert "down" in aaa and "down for 60 s" in aaa
    assert "up" in bbb and "down" not in bbb and "+80 ms in 10 s" in bbb


def test_status_explains_every_source_it_could_not_read() -> None:
    def dashboard_down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    readyz = {"glm": {"last_cold_start": {"at_unix": NOW_UNIX_S - 3 * 3600}}}
    code, text = run_ops(router(readyz, dashboard=dashboard_down), admin_key="wrong")
    assert code == 1
    assert "replicas unknown: Ray dashboard at http://dash.test: connection refused" in text
    assert "colos unknown: GET /admin/colos" in text and "401" in text
    # What is known is still shown: the router's models from /readyz, replicas as "?".
    glm = row(text, "glm")
    assert glm.split("│")[2].strip() == "?" and "3.0 h ago" in glm

    code, text = run_ops(router({"glm": {}}), admin_key="")
    assert code == 0
    assert "colos not shown: pass --admin-key" in text


def test_status_survives_a_router_that_is_down() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        if request.url.host == "dash.test":
            return httpx.Response(200, json=SERVE_APPLICATIONS)
        raise httpx.ConnectError("connection refused", request=request)

    code, text = run_ops(httpx.MockTransport(refuse))
    assert code == 1
    assert "router /readyz unreachable: connection refused" in text
    assert "1 / 2" in row(text, "glm")  # the dashboard still answered
