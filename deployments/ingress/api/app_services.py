"""How a route reaches the router's services: `make_app` sets them once on the app
(`app.state.services`); a module-level route reads them from its request, as vLLM's do."""

from __future__ import annotations

from typing import cast

from fastapi import FastAPI, Request

from deployments.ingress.serving.services import RouterServices


def install_services(app: FastAPI, services: RouterServices) -> None:
    app.state.services = services


def services_of(request: Request) -> RouterServices:
    return cast(RouterServices, request.app.state.services)
