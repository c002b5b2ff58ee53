"""GET /dashboard: the live edge map, a static page served from the package (no CDN, no build
step) plus the world outline it draws. The page itself holds no data: it polls the admin API
(/admin/dashboard-data) with the admin key the operator gives it."""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Response

from deployments.errors import RouteNotFoundError
from deployments.ingress.api.responses import json_response
from deployments.ingress.dashboard.world import world_outline

STATIC = resources.files("deployments.ingress.dashboard") / "static"
# The page's files, by name, with their media types: nothing else under static/ is served.
ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# The page runs only its own script and styles and talks only to this origin.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}


routes = APIRouter(prefix="/dashboard", include_in_schema=False)


@routes.get("")
async def page() -> Response:
    html = (STATIC / "index.html").read_bytes()
    return Response(html, media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


@routes.get("/world.json")
async def world() -> Response:
    return json_response(world_outline(), headers={"cache-control": "max-age=86400"})


@routes.get("/{asset}")
async def asset(asset: str) -> Response:
    media_type = ASSETS.get(asset)
    if media_type is None:
        raise RouteNotFoundError(f"no route /dashboard/{asset}")
    body = (STATIC / asset).read_bytes()
    return Response(body, media_type=media_type, headers=SECURITY_HEADERS)
