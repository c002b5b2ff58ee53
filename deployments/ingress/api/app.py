"""`make_app`: the router's FastAPI app, built once from the config and the services it serves:
the services set on the app's state, and one module-level router per API included."""

from __future__ import annotations

from fastapi import FastAPI

from deployments.config import AppConfig
from deployments.ingress.api import admin, dashboard, gateway_admin, health, openai, workers_ai
from deployments.ingress.api.app_services import install_services
from deployments.ingress.api.body_limit import BodyLimitMiddleware
from deployments.ingress.api.docs import install_docs
from deployments.ingress.api.errors import ErrorShapes, install_error_handler
from deployments.ingress.serving.services import RouterServices
from deployments.observability import TelemetryMiddleware


def make_app(config: AppConfig, services: RouterServices) -> FastAPI:
    app = FastAPI(
        title="ray-edge-ai",
        description="OpenAI-compatible and Workers-AI-style inference at the (simulated) edge",
        version="0.1.0",
        docs_url=None,  # install_docs serves both pages from local assets
        redoc_url=None,
    )
    shapes = ErrorShapes({}, by_pattern={workers_ai.ERROR_PATTERN: workers_ai.error_body})
    install_error_handler(app, shapes)
    install_services(app, services)
    app.include_router(health.routes)
    app.include_router(openai.routes)
    app.include_router(workers_ai.routes, prefix=workers_ai.PREFIX)
    for prefix in workers_ai.ACCOUNT_PREFIXES:
        # Workers AI's own paths, and its OpenAI-compatible ones (.../ai/v1/chat/completions):
        # the cloudflare SDK and an OpenAI SDK with base_url .../ai/v1 both work unchanged. The
        # same routers, each included once more under the account's prefix.
        app.include_router(workers_ai.routes, prefix=prefix)
        app.include_router(openai.routes, prefix=prefix)
    app.include_router(admin.routes)
    app.include_router(gateway_admin.routes)
    app.include_router(dashboard.routes)
    install_docs(app)
    app.add_middleware(BodyLimitMiddleware, limit=config.router.max_body_bytes, shapes=shapes)
    # Outermost, so a 413 is measured too. Ray Serve's proxy already echoes the client's
    # x-request-id (or makes one) on every response.
    app.add_middleware(TelemetryMiddleware, observability=services.observability)
    return app
