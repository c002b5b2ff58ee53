"""Probes: /healthz (the router answers) and /readyz (which models have a running replica)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from deployments.ingress.serving.services import RouterServices


def health_routes(services: RouterServices) -> APIRouter:
    routes = APIRouter()

    @routes.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @routes.get("/readyz")
    async def readyz() -> dict[str, Any]:
        return await services.readiness()

    return routes
