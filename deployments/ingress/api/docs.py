"""/docs (Swagger UI) and /redoc built from assets the router serves itself, never a CDN, so both
pages work on a machine without internet. The assets are the swagger-ui and redoc dist files
the pinned `fastapi-offline` package ships (we use its files only, not its app class)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/docs-assets"
ASSETS_DIR = Path(str(files("fastapi_offline") / "static"))
SWAGGER_JS, SWAGGER_CSS, REDOC_JS, FAVICON = (
    "swagger-ui-bundle.js",
    "swagger-ui.css",
    "redoc.standalone.js",
    "favicon.png",
)


def install_docs(app: FastAPI) -> None:
    """Add /docs, /redoc and their assets; the app must be built with docs_url=None and
    redoc_url=None (FastAPI's own pages point at jsdelivr)."""
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
    title = f"{app.title} API"

    def asset(request: Request, name: str) -> str:
        # root_path: the prefix a proxy mounts the app under (Serve's route_prefix).
        return f"{request.scope.get('root_path', '')}{ASSETS_PATH}/{name}"

    def openapi_url(request: Request) -> str:
        return f"{request.scope.get('root_path', '')}{app.openapi_url}"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url(request),
            title=title,
            swagger_js_url=asset(request, SWAGGER_JS),
            swagger_css_url=asset(request, SWAGGER_CSS),
            swagger_favicon_url=asset(request, FAVICON),
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url(request),
            title=title,
            redoc_js_url=asset(request, REDOC_JS),
            redoc_favicon_url=asset(request, FAVICON),
            with_google_fonts=False,  # fonts.googleapis.com: another CDN
        )
