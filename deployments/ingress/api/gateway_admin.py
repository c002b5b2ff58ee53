"""The admin API of gateway state: virtual keys (`/admin/keys`), the request log
(`/admin/logs`) and usage totals (`/admin/usage`). Admin key only, like every /admin route."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from deployments.ingress.api.admin import admin_only
from deployments.ingress.api.app_services import services_of
from deployments.ingress.api.responses import json_response
from deployments.ingress.serving.gateway_admin import GatewayAdmin
from deployments.ingress.state.request_log import MAX_PAGE_ROWS, LogFilter
from deployments.ingress.state.virtual_keys import NewKey

DEFAULT_PAGE_ROWS = 100


async def log_filter(  # async: no thread-pool hop (caller.py)
    key_id: str | None = None,
    model: str | None = None,
    status: Annotated[str | None, Query(description="a status (429) or class (4xx)")] = None,
    since: Annotated[float | None, Query(description="unix seconds, inclusive")] = None,
    until: Annotated[float | None, Query(description="unix seconds, exclusive")] = None,
) -> LogFilter:
    return LogFilter(key_id, model, status, since, until)


# At module level: FastAPI resolves these annotations (strings here) in the module's globals.
Filtered = Annotated[LogFilter, Depends(log_filter)]


routes = APIRouter(prefix="/admin", include_in_schema=False, dependencies=[Depends(admin_only)])


def gateway_of(request: Request) -> GatewayAdmin:
    return services_of(request).gateway


@routes.post("/keys")
async def create_key(spec: NewKey, request: Request) -> Response:
    """201 with the key's secret, shown this once."""
    return json_response(await gateway_of(request).create_key(spec), status=201)


@routes.get("/keys")
async def list_keys(request: Request) -> Response:
    return json_response(await gateway_of(request).list_keys())


@routes.delete("/keys/{key_id}")
async def revoke_key(key_id: str, request: Request) -> Response:
    return json_response(await gateway_of(request).revoke_key(key_id))


@routes.post("/keys/{key_id}/rotate")
async def rotate_key(key_id: str, request: Request) -> Response:
    return json_response(await gateway_of(request).rotate_key(key_id))


@routes.get("/logs")
async def logs(
    where: Filtered,
    request: Request,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE_ROWS)] = DEFAULT_PAGE_ROWS,
    before_id: Annotated[int | None, Query(ge=1, description="the last next_cursor")] = None,
) -> Response:
    return json_response(await gateway_of(request).logs(where, limit, before_id))


@routes.get("/usage")
async def usage(where: Filtered, request: Request) -> Response:
    return json_response(await gateway_of(request).usage(where))
