"""Probes: /healthz (the router answers) and /readyz (which models have a running replica)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from deployments.ingress.api.app_services import services_of

routes = APIRouter()


@routes.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@routes.get("/readyz")
async def readyz(request: Request) -> dict[str, Any]:
    return await services_of(request).readiness()
