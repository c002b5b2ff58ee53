"""The router's API does not change by accident: `app.openapi()` of the FastAPI app `make_app`
builds (on fake handles) equals tests/unit/data/openapi.json, and every route, the ones hidden from
the schema (/admin, /dashboard, /docs) included, is in tests/unit/data/routes.json.

After a deliberate API change, rewrite both snapshots and review their diff:

    UPDATE_OPENAPI_SNAPSHOT=1 .venv/bin/python -m pytest -q tests/unit/test_openapi_snapshot.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from router_fakes import app_config, fake_handles, services_for
from starlette.routing import Mount

from deployments.ingress.api.app import make_app

DATA = Path(__file__).parent / "data"
OPENAPI_SNAPSHOT = DATA / "openapi.json"
ROUTES_SNAPSHOT = DATA / "routes.json"
UPDATE_ENV = "UPDATE_OPENAPI_SNAPSHOT"


def router_app() -> Any:
    config = app_config()
    return make_app(config, services_for(config, fake_handles(), {}))


def route_table(app: Any) -> list[str]:
    """`METHODS path` of every route (mounts as `MOUNT path`), in the order they match. FastAPI
    keeps an included router as one entry (it resolves prefixes lazily): its routes are read
    from its effective routes, as FastAPI itself matches them."""
    rows = []
    for route in app.routes:
        included = getattr(route, "effective_route_contexts", None)
        for effective in included() if included is not None else [route]:
            if isinstance(effective, Mount):
                rows.append(f"MOUNT {effective.path}")
                continue
            methods = getattr(effective, "methods", None)
            if methods is None:
                methods = getattr(getattr(effective, "starlette_route", None), "methods", None)
            rows.append(f"{','.join(sorted(methods or []))} {effective.path}")
    return rows


def matches_snapshot(path: Path, value: Any) -> bool:
    text = json.dumps(value, indent=2, sort_keys=True) + "\n"
    if os.environ.get(UPDATE_ENV):
        path.write_text(text)
    return json.loads(path.read_text()) == json.loads(text)


def test_the_openapi_document_is_the_snapshot() -> None:
    assert matches_snapshot(OPENAPI_SNAPSHOT, router_app().openapi())


def test_every_route_hidden_or_not_is_the_snapshot() -> None:
    table = route_table(router_app())
    assert "POST /v1/chat/completions" in table
    assert "POST /client/v4/accounts/{account_id}/ai/v1/chat/completions" in table
    assert "DELETE /admin/keys/{key_id}" in table
    assert matches_snapshot(ROUTES_SNAPSHOT, table)
