"""/docs and /redoc work without internet: the router serves swagger-ui and redoc itself; a real
headless Chromium that may reach nothing but the router renders the operations list."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi.testclient import TestClient
from router_fakes import app_config, fake_handles, services_for

from deployments.ingress.api.app import make_app
from edgectl.local_cluster import free_port, wait_until

CDNS = ("cdn.jsdelivr.net", "unpkg.com", "googleapis.com", "cdnjs")
OPERATION = "/v1/chat/completions"
REDOC_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"


def router_app() -> Any:
    config = app_config()
    return make_app(config, services_for(config, fake_handles(), {}))


@pytest.mark.parametrize(
    ("page", "assets"),
    [
        ("/docs", ["swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"]),
        ("/redoc", ["redoc.standalone.js", "favicon.png"]),
    ],
)
def test_doc_pages_load_their_assets_from_the_router(page: str, assets: list[str]) -> None:
    with TestClient(router_app()) as client:
        html = client.get(page)
        assert html.status_code == 200 and "text/html" in html.headers["content-type"]
        assert not [cdn for cdn in CDNS if cdn in html.text]
        for name in assets:
            assert f'"/docs-assets/{name}"' in html.text
            asset = client.get(f"/docs-assets/{name}")
            assert asset.status_code == 200 and len(asset.content) > 1000
        assert "/openapi.json" in html.text
        assert OPERATION in client.get("/openapi.json").json()["paths"]


@pytest.fixture
def router_url() -> Iterator[str]:
    """The router app on a real socket (uvicorn in a thread), as a browser needs it."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(router_app(), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 30, "the router app to listen", every_s=0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.mark.parametrize(
    ("page", "operation"),
    [
        ("/docs", f'.opblock-summary-path[data-path="{OPERATION}"]'),
        ("/redoc", '[data-section-id^="operation/"]'),
    ],
)
def test_doc_pages_render_the_operations_offline(
    chromium: Any, router_url: str, page: str, operation: str
) -> None:
    context = chromium.new_context()
    refused: list[str] = []

    def only_the_router(route: Any) -> None:
        # Offline: any request that leaves the router fails, as on a machine without internet.
        if route.request.url.startswith(router_url):
            route.continue_()
        else:
            refused.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_router)
    browser_page = context.new_page()
    try:
        browser_page.goto(f"{router_url}{page}")
        browser_page.wait_for_selector(operation, timeout=30_000)
        assert OPERATION in browser_page.content()
        assert len(browser_page.query_selector_all(operation)) >= 1
        # All the page needs came from the router; redoc's bundle still links its own
        # "API docs by Redocly" logo on cdn.redoc.ly, a decoration that stays blank offline.
        assert [url for url in refused if url != REDOC_LOGO] == []
    finally:
        context.close()
