"""Gateway state through the router's app on fake model handles (no Ray) and a real SQLite
store: virtual keys made, used, rotated and revoked over the admin API; the request log and
usage filled by the ledger hook; budgets refusing or falling back; the API still serving while
the database is gone."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import TracerProvider
from rich.console import Console
from router_fakes import FakeInRouterModeration, app_config, fake_handles, in_every_region

from deployments.ingress.api.app import make_app
from deployments.ingress.security import KeyStore, key_digest
from deployments.ingress.serving.services import RouterServices, build_services
from deployments.ingress.state.database import Database
from deployments.ingress.state.gateway import GatewayState
from deployments.ingress.state.key_follower import KeyFollower
from deployments.ingress.state.postgres import PostgresDatabase
from deployments.ingress.state.sqlite import SqliteDatabase
from deployments.ingress.state.virtual_keys import VirtualKeys
from deployments.observability import (
    InMemoryMetricsBackend,
    RouterObservability,
    configure_access_logger,
)
from edgectl.cli import main as edge_main

USER_KEY = "sk-user-0123456789abcdef"
ADMIN_KEY = "sk-admin-0123456789abcdef"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
ENV = {"EDGE_API_KEYS": f"alice:{USER_KEY}", "EDGE_ADMIN_KEY": ADMIN_KEY}
NOW = 1_764_637_200.0  # 2025-12-02 01:00 UTC: 23 h before the day's budget renews
CHAT = {"model": "glm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
EMBED = {"model": "embedding", "input": "some text"}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@dataclass
class Gateway:
    client: TestClient
    state: GatewayState
    clock: list[float]
    connect: Callable[[], Database]  # another connection to its database: another replica's
    services: RouterServices

    def flush(self) -> None:
        """The write-behind queue written now (the background task does it every 0.5 s)."""
        self.client.portal.call(self.state.writer.flush_ready)  # type: ignore[union-attr]

    def new_key(self, **spec: Any) -> dict[str, Any]:
        response = self.client.post("/admin/keys", json={"name": "team", **spec}, headers=ADMIN)
        assert response.status_code == 201, response.text
        return dict(response.json())


@pytest.fixture(params=["sqlite", "postgres"])
def gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Gateway]:
    """The router on either backend: an SQLite file, or a database of its own on the session's
    PostgreSQL."""
    if request.param == "sqlite":
        yield from open_gateway(lambda: SqliteDatabase(tmp_path / "gateway.sqlite3"), ENV)
    else:
        dsn = request.getfixturevalue("postgres_database")
        yield from open_gateway(lambda: PostgresDatabase(dsn), ENV)


def open_gateway(
    connect: Callable[[], Database], env: dict[str, str], handles: dict[str, Any] | None = None
) -> Iterator[Gateway]:
    config = app_config()
    clock = [NOW]
    state = GatewayState.build(
        config.state,
        connect(),
        config.security,
        config.observability.prices,
        metrics_backend=InMemoryMetricsBackend(),
        wall_clock=lambda: clock[0],
    )
    observability = RouterObservability(
        config.observability,
        config.models,
        tracer=TracerProvider().get_tracer("test"),
        metrics_backend=InMemoryMetricsBackend(),
        access_logger=configure_access_logger(stream=io.StringIO()),
        ledger=state.ledger,
    )
    services = build_services(
        config,
        in_every_region(config, handles or fake_handles()),
        keys=KeyStore.from_env(env, config.security, virtual=state.follower),
        clock=lambda: 0.0,
        open_gate_classifier=FakeInRouterModeration().open,
        observability=observability,
        state=state,
    )
    with TestClient(make_app(config, services), raise_server_exceptions=False) as client:
        assert client.portal.call(state.ensure_ready)  # type: ignore[union-attr]
        yield Gateway(client, state, clock, connect, services)
        client.portal.call(state.database.close)  # type: ignore[union-attr]


def error_of(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    return dict(response.json()["error"])


def test_a_key_is_shown_once_used_rotated_and_revoked(gateway: Gateway):
    client = gateway.client
    made = gateway.new_key(models=["embedding", "@cf/zai-org/glm-4.7-flash"])
    secret = made["key"]
    assert made["models"] == ["embedding", "glm"]  # an alias is stored by the model's name
    assert client.post("/v1/embeddings", json=EMBED, headers=bearer(secret)).status_code == 200

    listed = client.get("/admin/keys", headers=ADMIN).json()["data"]
    assert [k["id"] for k in listed] == [made["id"]] and listed[0]["status"] == "active"
    assert secret not in str(listed) and "digest" not in listed[0] and "key" not in listed[0]

    rotated = client.post(f"/admin/keys/{made['id']}/rotate", headers=ADMIN).json()["key"]
    assert error_of(client.post("/v1/embeddings", json=EMBED, headers=bearer(secret)), 401)
    assert client.post("/v1/embeddings", json=EMBED, headers=bearer(rotated)).status_code == 200

    # Another router replica on the same database follows the revocation at its next poll.
    database = gateway.connect()
    other = KeyFollower(VirtualKeys(database), app_config().security)
    client.portal.call(other.refresh)  # type: ignore[union-attr]
    assert other.principal(key_digest(rotated)) is not None

    revoked = client.delete(f"/admin/keys/{made['id']}", headers=ADMIN)
    assert revoked.json() == {"id": made["id"], "revoked": True}
    assert error_of(client.post("/v1/embeddings", json=EMBED, headers=bearer(rotated)), 401)
    assert client.portal.call(other.refresh)  # type: ignore[union-attr]
    assert other.principal(key_digest(rotated)) is None
    client.portal.call(database.close)  # type: ignore[union-attr]
    assert client.get("/admin/keys", headers=ADMIN).json()["data"][0]["status"] == "revoked"


def test_admin_errors_of_keys(gateway: Gateway):
    client = gateway.client
    unknown = client.post("/admin/keys", json={"name": "x", "models": ["gpt-9"]}, headers=ADMIN)
    assert error_of(unknown, 400)["param"] == "models"
    fallback = {"name": "x", "budget": {"cost_units": 1, "fallback_model": "nope"}}
    assert error_of(client.post("/admin/keys", json=fallback, headers=ADMIN), 400)["param"] == (
        "budget.fallback_model"
    )
    assert error_of(client.post("/admin/keys", json={"name": "x", "rpm": 1}, headers=ADMIN), 400)
    assert error_of(client.delete("/admin/keys/vk-none", headers=ADMIN), 404)["code"] == (
        "key_not_found"
    )
    assert error_of(client.post("/admin/keys/vk-none/rotate", headers=ADMIN), 404)
    user = bearer(USER_KEY)
    assert error_of(client.get("/admin/keys", headers=user), 403)
    secret = gateway.new_key()["key"]
    assert error_of(client.get("/admin/logs", headers=bearer(secret)), 403)
    assert error_of(client.get("/admin/logs?status=abc", headers=ADMIN), 400)["param"] == "status"


def test_an_open_api_closes_with_its_first_virtual_key(tmp_path: Path):
    sqlite = lambda: SqliteDatabase(tmp_path / "gateway.sqlite3")  # noqa: E731
    for gateway in open_gateway(sqlite, {"EDGE_ADMIN_KEY": ADMIN_KEY}):
        client = gateway.client
        assert client.post("/v1/embeddings", json=EMBED).status_code == 200  # open
        secret = gateway.new_key()["key"]
        assert error_of(client.post("/v1/embeddings", json=EMBED), 401)["code"] == (
            "missing_api_key"
        )
        assert client.post("/v1/embeddings", json=EMBED, headers=bearer(secret)).status_code == 200


def test_an_expired_key_and_a_model_the_key_may_not_use_are_refused(gateway: Gateway):
    client = gateway.client
    secret = gateway.new_key(models=["embedding"], expires_at=NOW + 60)["key"]
    refused = client.post("/v1/chat/completions", json=CHAT, headers=bearer(secret))
    assert error_of(refused, 403)["code"] == "model_not_allowed"
    gateway.clock[0] = NOW + 60
    expired = client.post("/v1/embeddings", json=EMBED, headers=bearer(secret))
    assert error_of(expired, 401)["code"] == "expired_api_key"
    assert client.get("/admin/keys", headers=ADMIN).json()["data"][0]["status"] == "expired"


def test_the_ledger_logs_every_model_request_with_payloads_only_when_asked(gateway: Gateway):
    client = gateway.client
    user = bearer(USER_KEY)
    sent = client.post("/v1/chat/completions", json=CHAT, headers={**user, "x-request-id": "r1"})
    assert sent.status_code == 200
    client.post(
        "/v1/embeddings", json=EMBED, headers={**user, "cf-aig-collect-log-payload": "true"}
    )
    client.post("/v1/embeddings", json={"model": "nope", "input": "x"}, headers=user)
    client.get("/v1/models", headers=user)  # not a model request: no row
    collector = gateway.new_key(collect_payloads=True)["key"]
    client.post(
        "/v1/embeddings",
        json=EMBED,
        headers={**bearer(collector), "cf-aig-collect-log-payload": "false"},
    )
    client.post("/v1/embeddings", json={**EMBED, "input": "kept"}, headers=bearer(collector))
    gateway.flush()

    rows = client.get("/admin/logs", headers=ADMIN).json()["data"]
    assert [r["status"] for r in rows] == [200, 200, 404, 200, 200]
    chat = rows[-1]
    assert chat["request_id"] == "r1" and chat["key_id"] == "alice" and chat["model"] == "glm"
    assert (chat["input_tokens"], chat["output_tokens"]) == (7, 5)
    assert chat["cost_units"] == pytest.approx(7 * 50e-6 + 5 * 200e-6)  # serve_config's prices
    assert chat["colo"] and chat["region"] and chat["route_reason"] and chat["latency_ms"] > 0
    assert chat["payload"] is None and chat["ttft_ms"] is None  # not a stream
    assert '"some text"' in rows[3]["payload"]  # the header opted in
    assert rows[1]["payload"] is None  # the header opted out of its key's collection
    assert '"kept"' in rows[0]["payload"]  # the key collects
    assert rows[2]["cost_units"] == 0 and rows[2]["error_type"] is None

    page = client.get("/admin/logs?limit=2", headers=ADMIN).json()
    older = client.get(f"/admin/logs?limit=2&before_id={page['next_cursor']}", headers=ADMIN)
    assert [r["id"] for r in page["data"] + older.json()["data"]] == [r["id"] for r in rows[:4]]
    errors = client.get("/admin/logs?status=4xx&key_id=alice", headers=ADMIN).json()["data"]
    assert [r["model"] for r in errors] == ["nope"]

    usage = client.get("/admin/usage?key_id=alice", headers=ADMIN).json()["data"]
    by_model = {row["model"]: row for row in usage}
    assert by_model["embedding"]["requests"] == 1 and by_model["glm"]["requests"] == 1
    assert by_model["glm"]["day"] == "2025-12-02"
    assert by_model["glm"]["cost_units"] == pytest.approx(chat["cost_units"])


def test_a_spent_budget_is_a_429_until_the_period_ends_or_the_fallback_serves(
    gateway: Gateway,
):
    """glm costs about 0.00345 cost units by its estimate (16 tokens out): a budget of 0.01
    holds two such requests in flight; a third is refused until they settle."""
    client = gateway.client
    capped = gateway.new_key(budget={"cost_units": 0.01, "period": "day"})["key"]
    statuses = [
        client.post("/v1/chat/completions", json=CHAT, headers=bearer(capped)).status_code
        for _ in range(3)
    ]
    assert statuses == [200, 200, 429]  # nothing settled yet: both reservations still held
    refused = client.post("/v1/chat/completions", json=CHAT, headers=bearer(capped))
    assert error_of(refused, 429)["code"] == "budget_exceeded"
    assert refused.headers["retry-after"] == str(23 * 3600)  # to the end of the UTC day
    gateway.flush()  # settled: each really cost 0.00135, so 0.0073 is left
    assert client.post("/v1/chat/completions", json=CHAT, headers=bearer(capped)).status_code == (
        200
    )
    leases = gateway.state.budgets.leases
    assert leases is not None
    gateway.client.portal.call(leases.top_ups_done)
    listed = client.get("/admin/keys", headers=ADMIN).json()["data"][0]["budget"]
    assert listed["spent_cost_units"] == pytest.approx(2 * 0.00135)
    # Reserved: the request in flight, and what this router's lease holds ahead of need.
    assert 0 < leases.leased < 0.00345
    assert listed["reserved_cost_units"] == pytest.approx(0.00345 + leases.leased)

    fallback = gateway.new_key(
        budget={"cost_units": 0.001, "period": "month", "fallback_model": "kimi"}
    )["key"]
    served = client.post("/v1/chat/completions", json=CHAT, headers=bearer(fallback))
    assert served.status_code == 200 and served.json()["model"] == "kimi"
    deterministic = {**CHAT, "temperature": 0}
    for _ in range(2):  # a fallback's answer is never cached as the asked model's
        again = client.post("/v1/chat/completions", json=deterministic, headers=bearer(fallback))
        assert again.json()["model"] == "kimi" and again.headers.get("x-edge-cache") != "HIT"
    gateway.flush()
    row = client.get("/admin/logs?limit=3", headers=ADMIN).json()["data"][-1]
    assert row["model"] == "kimi" and row["cost_units"] == pytest.approx(7 * 60e-6 + 5 * 250e-6)


def test_requests_are_served_while_the_database_is_gone(tmp_path: Path):
    """SQLite's files moved away (a volume gone: what opens in their place has no tables), then
    back: requests never fail but a budgeted key's past its lease (503 budget_unverifiable),
    records wait in the queue and are written after, settling the spend; the leases go back when
    the router stops. (PostgreSQL killed under load: tests/integration/test_gateway_state.py.)"""
    sqlite = lambda: SqliteDatabase(tmp_path / "gateway.sqlite3")  # noqa: E731
    for gateway in open_gateway(sqlite, ENV):
        served_while_gone(gateway, tmp_path)


def served_while_gone(gateway: Gateway, tmp_path: Path) -> None:
    client, state = gateway.client, gateway.state
    leases = state.budgets.leases
    assert leases is not None  # the default
    capped = gateway.new_key(budget={"cost_units": 1.0})["key"]
    unleased = gateway.new_key(budget={"cost_units": 1.0})["key"]
    assert client.post("/v1/embeddings", json=EMBED, headers=bearer(capped)).status_code == 200
    client.portal.call(leases.top_ups_done)
    gateway.flush()
    files = ["gateway.sqlite3", "gateway.sqlite3-wal", "gateway.sqlite3-shm"]

    def move(source: Path, target: Path) -> None:
        client.portal.call(state.database.close)  # type: ignore[union-attr]
        target.mkdir(exist_ok=True)
        for name in files:
            (target / name).unlink(missing_ok=True)
            if (source / name).exists():
                (source / name).rename(target / name)

    move(tmp_path, tmp_path / "away")
    client.portal.call(state.follower.poll)  # type: ignore[union-attr]  # fails: keys kept
    for headers in (bearer(USER_KEY), bearer(capped)):  # no budget; a budget's lease holds it
        assert client.post("/v1/embeddings", json=EMBED, headers=headers).status_code == 200
    refused = client.post("/v1/embeddings", json=EMBED, headers=bearer(unleased))
    assert error_of(refused, 503)["code"] == "budget_unverifiable"
    assert refused.headers["retry-after"] == "1"
    gateway.flush()
    assert state.writer.held == 3 and state.writer.failed_batches == 1  # queued, not lost
    assert state.budgets.unchecked == 0 and leases.refused == 1
    assert error_of(client.get("/admin/logs", headers=ADMIN), 503)["code"] == "state_unavailable"

    move(tmp_path / "away", tmp_path)
    gateway.flush()
    assert state.writer.held == 0 and leases.unsettled == 0
    rows = client.get("/admin/logs", headers=ADMIN).json()["data"]
    capped_id = state.follower.principal(key_digest(capped)).key_id  # type: ignore[union-attr]
    assert [r["key_id"] for r in rows if r["status"] == 200] == [capped_id, "alice", capped_id]
    budgets = budgets_of(gateway)
    spent = sum(r["cost_units"] for r in rows if r["key_id"] == capped_id)
    assert budgets[capped_id]["spent_cost_units"] == pytest.approx(spent)
    assert budgets[capped_id]["reserved_cost_units"] == pytest.approx(leases.leased)

    client.portal.call(leases.close)  # the router stops: its leases go back
    budgets = budgets_of(gateway)
    assert budgets[capped_id]["reserved_cost_units"] == pytest.approx(0)
    assert budgets[capped_id]["spent_cost_units"] == pytest.approx(spent)


def budgets_of(gateway: Gateway) -> dict[str, dict[str, Any]]:
    """Each virtual key's budget as the admin API lists it, by key id."""
    keys = gateway.client.get("/admin/keys", headers=ADMIN).json()["data"]
    return {key["id"]: key["budget"] for key in keys}


def edge(gateway: Gateway, *argv: str) -> tuple[int, str]:
    """`edge` against this router, through the test client's own transport."""
    console = Console(record=True, width=200, color_system=None)

    def forward(request: httpx.Request) -> httpx.Response:
        answer = gateway.client.request(
            request.method,
            request.url.path,
            params=request.url.params,
            content=request.content,
            headers={
                name: request.headers[name]
                for name in ("authorization", "content-type")
                if name in request.headers
            },
        )
        return httpx.Response(answer.status_code, content=answer.content)

    code = edge_main(
        [*argv, "--url", "http://testserver", "--admin-key", ADMIN_KEY],
        transport=httpx.MockTransport(forward),
        console=console,
        wall_clock=lambda: gateway.clock[0],
    )
    return code, console.export_text()


def test_edge_keys_and_usage_drive_the_admin_api(gateway: Gateway):
    code, out = edge(
        gateway, "keys", "create", "ci", "--models", "embedding", "--budget", "5",
        "--period", "day", "--fallback", "embedding", "--expires", "30d",
    )  # fmt: skip
    assert code == 0, out
    key_id, secret = out.split()[1], out.split()[-1]
    assert secret.startswith("sk-edge-")
    assert gateway.client.post(
        "/v1/embeddings", json=EMBED, headers=bearer(secret)
    ).status_code == (200)
    code, listed = edge(gateway, "keys", "list")
    assert code == 0 and key_id in listed and "5/day -> embedding" in listed
    assert secret not in listed and "2026-01-01 01:00 UTC" in listed  # expires in 30 days

    code, out = edge(gateway, "keys", "rotate", key_id)
    new_secret = out.split()[-1]
    assert code == 0 and new_secret != secret
    assert edge(gateway, "keys", "revoke", key_id)[0] == 0
    assert gateway.client.post(
        "/v1/embeddings", json=EMBED, headers=bearer(new_secret)
    ).status_code == (401)
    code, out = edge(gateway, "keys", "revoke", "vk-missing")
    assert code == 1 and "404" in out

    gateway.flush()
    code, usage = edge(gateway, "usage", "--key", key_id)
    assert code == 0 and "2025-12-02" in usage and key_id in usage
    assert edge_main(["usage"], console=Console(file=io.StringIO())) == 2  # no admin key
