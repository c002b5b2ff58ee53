"""The admin API (fault drills): list colos and regions, set and clear their faults; the live
dashboard's data. It needs the admin key, and does not exist (404) when none is configured."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Depends, Request, Response

from deployments.ingress.api.responses import json_response
from deployments.ingress.serving.services import RouterServices
from edge_sim.faults import ColoFault


def admin_only(services: RouterServices) -> Callable[[Request], Awaitable[None]]:
    """The dependency of every /admin route: the admin key, or 404/401/403."""

    async def authorized(request: Request) -> None:  # async: no thread-pool hop (caller.py)
        services.keys.authorize_admin(request.headers.get("authorization"), request.url.path)

    return authorized


def admin_routes(services: RouterServices) -> APIRouter:
    routes = APIRouter(
        prefix="/admin", include_in_schema=False, dependencies=[Depends(admin_only(services))]
    )

    @routes.get("/colos")
    async def colos() -> Response:
        return json_response(await services.drills.colos())

    @routes.post("/colos/{colo_id}/faults")
    async def set_fault(colo_id: str, fault: ColoFault) -> Response:
        return json_response(await services.drills.set_fault(colo_id, fault))

    @routes.delete("/colos/{colo_id}/faults")
    async def clear_faults(colo_id: str) -> Response:
        return json_response(await services.drills.clear_faults(colo_id))

    @routes.get("/regions")
    async def regions() -> Response:
        return json_response(await services.drills.region_states())

    @routes.post("/regions/{region}/faults")
    async def set_region_fault(region: str, fault: ColoFault) -> Response:
        return json_response(await services.drills.set_region_fault(region, fault))

    @routes.delete("/regions/{region}/faults")
    async def clear_region_faults(region: str) -> Response:
        return json_response(await services.drills.clear_region_faults(region))

    @routes.get("/dashboard-data")
    async def dashboard_data() -> Response:
        return json_response(await services.dashboard.data())

    return routes
