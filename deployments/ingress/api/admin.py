"""The admin API (fault drills): list colos and regions, set and clear their faults; the live
dashboard's data. It needs the admin key, and does not exist (404) when none is configured."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from deployments.ingress.api.app_services import services_of
from deployments.ingress.api.responses import json_response
from edge_sim.faults import ColoFault


async def admin_only(request: Request) -> None:  # async: no thread-pool hop (caller.py)
    """The dependency of every /admin route: the admin key, or 404/401/403."""
    keys = services_of(request).keys
    keys.authorize_admin(request.headers.get("authorization"), request.url.path)


routes = APIRouter(prefix="/admin", include_in_schema=False, dependencies=[Depends(admin_only)])


@routes.get("/colos")
async def colos(request: Request) -> Response:
    return json_response(await services_of(request).drills.colos())


@routes.post("/colos/{colo_id}/faults")
async def set_fault(colo_id: str, fault: ColoFault, request: Request) -> Response:
    return json_response(await services_of(request).drills.set_fault(colo_id, fault))


@routes.delete("/colos/{colo_id}/faults")
async def clear_faults(colo_id: str, request: Request) -> Response:
    return json_response(await services_of(request).drills.clear_faults(colo_id))


@routes.get("/regions")
async def regions(request: Request) -> Response:
    return json_response(await services_of(request).drills.region_states())


@routes.post("/regions/{region}/faults")
async def set_region_fault(region: str, fault: ColoFault, request: Request) -> Response:
    return json_response(await services_of(request).drills.set_region_fault(region, fault))


@routes.delete("/regions/{region}/faults")
async def clear_region_faults(region: str, request: Request) -> Response:
    return json_response(await services_of(request).drills.clear_region_faults(region))


@routes.get("/dashboard-data")
async def dashboard_data(request: Request) -> Response:
    return json_response(await services_of(request).dashboard.data())
