"""GET /dashboard and its data on fake model handles (no Ray): the page and its assets, the admin
auth of its data, what the data holds after traffic, and the page in a real headless Chromium."""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn
from fastapi.testclient import TestClient
from router_fakes import app_config, fake_handles, in_every_region

from deployments.ingress.api.app import make_app
from deployments.ingress.security import KeyStore
from deployments.ingress.serving.models import DeploymentState
from deployments.ingress.serving.services import RouterServices, build_services
from deployments.ingress.state.gateway import GatewayState
from deployments.ingress.state.request_log import RequestLog, RequestRecord
from deployments.ingress.state.sqlite import SqliteDatabase
from deployments.observability import InMemoryMetricsBackend, RouterObservability
from deployments.observability.access_log import configure_access_logger
from edgectl.local_cluster import wait_until

T = TypeVar("T")
ADMIN_KEY = "admin-secret"
USER_KEY = "sk-user"
ENV = {"EDGE_ADMIN_KEY": ADMIN_KEY, "EDGE_API_KEYS": f"alice:{USER_KEY}"}
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
USER = {"authorization": f"Bearer {USER_KEY}"}


class FakeServe:
    """Serve's replica states per model, changed by the test (a cold start: 0 -> 1)."""

    def __init__(self) -> None:
        self.states: dict[str, dict[str, int]] = {
            "glm": {"RUNNING": 1},
            "kimi": {},
            "embedding": {"RUNNING": 1},
            "moderation": {"RUNNING": 1},
        }

    async def __call__(self) -> Mapping[str, DeploymentState]:
        return {
            name: DeploymentState("HEALTHY", states.get("RUNNING", 0), dict(states))
            for name, states in self.states.items()
        }


def services(env: Mapping[str, str] = ENV, serve: FakeServe | None = None) -> RouterServices:
    config = app_config()
    observability = RouterObservability(
        config.observability,
        config.models,
        metrics_backend=InMemoryMetricsBackend(),
        access_logger=configure_access_logger(stream=io.StringIO()),
    )
    return build_services(
        config,
        in_every_region(config, fake_handles()),
        keys=KeyStore.from_env(env, config.security),
        observability=observability,
        deployment_states=serve or FakeServe(),
    )


@pytest.fixture
def client() -> Iterator[TestClient]:
    with TestClient(make_app(app_config(), services())) as client:
        yield client


def test_the_page_and_its_assets_are_served_from_the_package(client: TestClient):
    page = client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert '<script src="/dashboard/dashboard.js"' in page.text
    assert "http" not in page.text.replace("http-equiv", "")  # no CDN, nothing off this origin
    script = client.get("/dashboard/dashboard.js")
    assert script.headers["content-type"].startswith("text/javascript")
    assert "/admin/dashboard-data" in script.text
    assert client.get("/dashboard/dashboard.css").headers["content-type"].startswith("text/css")
    world = client.get("/dashboard/world.json").json()
    assert len(world["countries"]) > 150
    for missing in ("/dashboard/index.html", "/dashboard/..%2Fworld.py", "/dashboard/nope.js"):
        assert client.get(missing).status_code == 404, missing


def test_dashboard_data_needs_the_admin_key(client: TestClient):
    assert client.get("/admin/dashboard-data").status_code == 401
    assert client.get("/admin/dashboard-data", headers=USER).status_code == 403
    assert client.get("/admin/dashboard-data", headers=ADMIN).status_code == 200


def test_without_an_admin_key_the_data_route_does_not_exist():
    with TestClient(make_app(app_config(), services(env={}))) as client:
        assert client.get("/admin/dashboard-data", headers=ADMIN).status_code == 404
        assert client.get("/dashboard").status_code == 200  # the page says how to turn it on
        assert "EDGE_ADMIN_KEY" in client.get("/dashboard").text


def test_the_data_shows_colos_drills_replicas_and_traffic(client: TestClient):
    chat = {"model": "glm", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(3):
        assert client.post("/v1/chat/completions", json=chat, headers=USER).status_code == 200
    down = client.post(
        "/admin/colos/FRA/faults", json={"down": True, "duration_s": 30}, headers=ADMIN
    )
    assert down.status_code == 200

    data = client.get("/admin/dashboard-data", headers=ADMIN).json()
    colos = {colo["id"]: colo for colo in data["colos"]}
    assert colos["FRA"]["state"] == "down" and colos["FRA"]["drill"]["down"] is True
    assert all(c["state"] == "healthy" for i, c in colos.items() if i != "FRA")
    [region] = data["regions"]
    assert region["replicas"]["kimi"] == {"running": 0, "wanted": 0}
    assert region["replicas"]["glm"] == {"running": 1, "wanted": 1}
    [row] = data["traffic"]
    assert (row["model"], row["requests"]) == ("glm", 3)
    assert sum(data["route_reasons"].values()) == 3
    [key] = data["keys"]
    assert (key["key_id"], key["requests"]) == ("alice", 3)
    # 3 x (7 input tokens at 50/M + 5 output tokens at 200/M), serve_config.yaml's glm price
    assert key["cost_units"] == pytest.approx(3 * (7 * 50 + 5 * 200) / 1e6)
    # The page's own polling is not traffic, nor traced.
    client.get("/admin/dashboard-data", headers=ADMIN)
    again = client.get("/admin/dashboard-data", headers=ADMIN).json()
    assert [r["requests"] for r in again["traffic"]] == [3]


# ---- in a real browser ----------------------------------------------------------------------


@contextlib.contextmanager
def served(app: Any) -> Iterator[str]:
    """The app on a real HTTP port, in a thread, for a browser to load."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "uvicorn to listen", every_s=0.05)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def test_the_page_in_chromium_draws_every_colo_and_runs_a_drill(chromium, artefacts):
    serve = FakeServe()
    router = services(serve=serve)
    colo_ids = [colo["id"] for colo in router.drills.network.colo_states()]
    with served(make_app(app_config(), router)) as base_url:
        page = chromium.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{base_url}/dashboard#key={ADMIN_KEY}")
        page.wait_for_selector("#colos circle[data-state]", timeout=10_000)
        assert "key=" not in page.url  # the key left the address bar
        assert sorted(
            page.eval_on_selector_all("#colos circle", "cs => cs.map(c => c.dataset.colo)")
        ) == sorted(colo_ids)
        assert page.locator("#countries path").count() > 150

        page.select_option("#drill-colo", "SIN")
        page.select_option("#drill-kind", "down")
        page.click("#drill-start")
        page.wait_for_selector('#colo-SIN[data-state="down"]', timeout=3_000)
        page.click("#drill-clear")
        page.wait_for_selector('#colo-SIN[data-state="healthy"]', timeout=3_000)

        kimi = '#regions td[data-model="kimi"]'
        assert page.get_attribute(kimi, "data-running") == "0"
        serve.states["kimi"] = {"STARTING": 1}
        page.wait_for_selector(f'{kimi}[data-wanted="1"][data-running="0"]', timeout=3_000)
        serve.states["kimi"] = {"RUNNING": 1}
        page.wait_for_selector(f'{kimi}[data-running="1"]', timeout=3_000)
        page.screenshot(path=str(artefacts / "dashboard.png"), full_page=True)
        assert errors == []


def test_the_page_shows_traffic_and_top_keys(chromium):
    router = services()
    with served(make_app(app_config(), router)) as base_url:
        chat = {"model": "glm", "messages": [{"role": "user", "content": "hi"}]}
        for _ in range(2):
            httpx.post(
                f"{base_url}/v1/chat/completions", json=chat, headers=USER
            ).raise_for_status()
        page = chromium.new_page()
        page.goto(f"{base_url}/dashboard#key={ADMIN_KEY}")
        page.wait_for_selector('#keys tr[data-key="alice"]', timeout=5_000)
        row = page.locator('#traffic tr[data-model="glm"] td')
        assert row.nth(5).inner_text() == "2"  # requests
        assert page.locator("#reasons .bar").count() >= 1


def test_the_page_says_when_the_admin_api_is_off(chromium):
    with served(make_app(app_config(), services(env={}))) as base_url:
        page = chromium.new_page()
        page.goto(f"{base_url}/dashboard#key=anything")
        page.wait_for_selector("#admin-off:not([hidden])", timeout=5_000)
        assert "EDGE_ADMIN_KEY" in page.inner_text("#admin-off")


def test_the_page_asks_for_the_key_and_keeps_it_in_the_session(chromium):
    with served(make_app(app_config(), services())) as base_url:
        page = chromium.new_page()
        page.goto(f"{base_url}/dashboard")
        page.wait_for_selector("#key-form:not([hidden])", timeout=5_000)
        page.fill("#key-input", "wrong")
        page.click("#key-submit")
        page.wait_for_selector("#key-error:not([hidden])", timeout=5_000)
        page.fill("#key-input", ADMIN_KEY)
        page.click("#key-submit")
        page.wait_for_selector("#board:not([hidden])", timeout=5_000)
        stored = page.evaluate("sessionStorage.getItem('ray-edge-ai.admin-key')")
        assert stored == ADMIN_KEY
        page.reload()
        page.wait_for_selector("#colos circle[data-state]", timeout=5_000)  # no second prompt


def apart(coroutine: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on a loop of its own thread: Playwright's sync API holds this one's."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, coroutine()).result()  # type: ignore[arg-type]


def test_the_page_shows_the_request_log_and_usage_with_filters(chromium, tmp_path):
    """Gateway state on (SQLite): rows written by another router replica to the same file are on
    the page, newest first; a status filter and the usage table follow the admin API."""
    config = app_config()
    state = GatewayState.build(
        config.state,
        SqliteDatabase(tmp_path / "gateway.sqlite3"),
        config.security,
        config.observability.prices,
    )
    assert apart(state.ensure_ready)
    now = time.time()
    day = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%d")
    rows = [
        RequestRecord(
            ts=now - 10 + i, day=day, request_id=f"req-{i}", key_id="alice", endpoint="/v1/x",
            model="glm", region="eu", colo="FRA", route_reason="nearest",
            status=429 if i == 2 else 200, stream=False, input_tokens=7, output_tokens=5,
            cost_units=0.0 if i == 2 else 0.5, latency_ms=12.0, ttft_ms=None,
            cold_start_ms=None, cache=None, error_type=None,
        )
        for i in range(3)
    ]  # fmt: skip

    async def other_replica_writes() -> None:
        database = SqliteDatabase(tmp_path / "gateway.sqlite3")
        await RequestLog(database).write(rows)
        await database.close()

    apart(other_replica_writes)
    router = build_services(
        config,
        in_every_region(config, fake_handles()),
        keys=KeyStore.from_env(ENV, config.security, virtual=state.follower),
        deployment_states=FakeServe(),
        state=state,
    )
    with served(make_app(config, router)) as base_url:
        page = chromium.new_page(viewport={"width": 1400, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{base_url}/dashboard#key={ADMIN_KEY}")
        page.wait_for_selector('#log-rows tr[data-request-id="req-0"]', timeout=10_000)
        shown = page.eval_on_selector_all(
            "#log-rows tr[data-request-id]", "rs => rs.map(r => r.dataset.requestId)"
        )
        assert shown == ["req-2", "req-1", "req-0"]
        usage = page.locator('#usage tr[data-key="alice"][data-model="glm"] td')
        assert usage.nth(3).inner_text() == "3" and usage.nth(6).inner_text() == "1.000000"

        page.fill("#log-status", "4xx")
        page.click("#log-apply")
        page.wait_for_selector('#log-rows tr[data-request-id="req-1"]', state="detached")
        assert page.eval_on_selector_all(
            "#log-rows tr[data-request-id]", "rs => rs.map(r => r.dataset.requestId)"
        ) == ["req-2"]
        assert errors == []
    apart(state.database.close)


def test_the_page_says_when_gateway_state_is_off(chromium):
    with served(make_app(app_config(), services())) as base_url:
        page = chromium.new_page()
        page.goto(f"{base_url}/dashboard#key={ADMIN_KEY}")
        page.wait_for_selector("#state-note:not([hidden])", timeout=10_000)
        assert "gateway state is off" in page.inner_text("#state-note")
