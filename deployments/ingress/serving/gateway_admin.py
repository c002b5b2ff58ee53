"""The admin API's gateway state: virtual keys (create, list, revoke, rotate), the request log
and usage totals. Model names are checked against the catalogue and stored by their served name;
a database that does not answer is a 503 here, where an operator waits for the answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from deployments.errors import (
    InvalidRequestError,
    KeyNotFoundError,
    NotFoundError,
    RouteNotFoundError,
    StateUnavailableError,
)
from deployments.ingress.serving.models import ModelCatalogue
from deployments.ingress.state.database import StoreUnavailable
from deployments.ingress.state.gateway import GatewayState
from deployments.ingress.state.request_log import LogFilter, usage_dict, valid_status_filter
from deployments.ingress.state.spend import period_of
from deployments.ingress.state.virtual_keys import NewKey, VirtualKey


@asynccontextmanager
async def _answering() -> AsyncIterator[None]:
    try:
        yield
    except StoreUnavailable as error:
        raise StateUnavailableError(f"the gateway's database does not answer: {error}") from None


@dataclass(frozen=True)
class GatewayAdmin:
    catalogue: ModelCatalogue
    state: GatewayState | None

    def _state(self, path: str) -> GatewayState:
        if self.state is None:
            raise RouteNotFoundError(f"no route {path}: gateway state is off (state.enabled)")
        if not self.state.ready:
            raise StateUnavailableError("the gateway's database has not answered yet")
        return self.state

    def _served_name(self, name: str, field: str) -> str:
        try:
            return self.catalogue.get(name).name
        except NotFoundError:
            raise InvalidRequestError(f"{field}: no served model {name!r}", param=field) from None

    def _checked(self, spec: NewKey) -> NewKey:
        """`spec` with its models by their served names (an alias is accepted)."""
        update: dict[str, Any] = {}
        if spec.models is not None:
            update["models"] = sorted({self._served_name(m, "models") for m in spec.models})
        budget = spec.budget
        if budget is not None and budget.fallback_model is not None:
            fallback = self._served_name(budget.fallback_model, "budget.fallback_model")
            update["budget"] = budget.model_copy(update={"fallback_model": fallback})
        return spec.model_copy(update=update)

    async def create_key(self, spec: NewKey) -> dict[str, Any]:
        state = self._state("/admin/keys")
        spec = self._checked(spec)
        async with _answering():
            key, secret = await state.keys.create(spec, state.wall_clock())
            await state.follower.refresh()  # this replica knows it at once; the others poll
        return {**key.public(state.wall_clock()), "key": secret}

    async def list_keys(self) -> dict[str, Any]:
        state = self._state("/admin/keys")
        now = state.wall_clock()
        async with _answering():
            keys = await state.keys.all()
            periods = {k.id: period_of(k.budget_period, now)[0] for k in keys if k.budget_period}
            spend = await state.spend.of_period(periods)
        return {"data": [self._listed(key, spend.get(key.id), now) for key in keys]}

    @staticmethod
    def _listed(key: VirtualKey, spend: Any, now: float) -> dict[str, Any]:
        listed = key.public(now)
        if listed["budget"] is not None:
            listed["budget"]["spent_cost_units"] = spend.spent if spend else 0.0
            listed["budget"]["reserved_cost_units"] = spend.reserved if spend else 0.0
        return listed

    async def revoke_key(self, key_id: str) -> dict[str, Any]:
        state = self._state(f"/admin/keys/{key_id}")
        async with _answering():
            if not await state.keys.revoke(key_id, state.wall_clock()):
                raise KeyNotFoundError(f"no key {key_id!r}", param="id")
            await state.follower.refresh()
        return {"id": key_id, "revoked": True}

    async def rotate_key(self, key_id: str) -> dict[str, Any]:
        state = self._state(f"/admin/keys/{key_id}/rotate")
        async with _answering():
            secret = await state.keys.rotate(key_id)
            if secret is None:
                raise KeyNotFoundError(f"no unrevoked key {key_id!r}", param="id")
            await state.follower.refresh()
        return {"id": key_id, "key": secret}

    async def logs(self, where: LogFilter, limit: int, before_id: int | None) -> dict[str, Any]:
        state = self._state("/admin/logs")
        _check_filter(where)
        async with _answering():
            page = await state.log_table.page(where, limit, before_id)
        return {"data": page.rows, "next_cursor": page.next_cursor}

    async def usage(self, where: LogFilter) -> dict[str, Any]:
        state = self._state("/admin/usage")
        _check_filter(where)
        async with _answering():
            rows = await state.log_table.usage(where)
        return {"data": [usage_dict(row) for row in rows]}


def _check_filter(where: LogFilter) -> None:
    if where.status is not None and not valid_status_filter(where.status):
        raise InvalidRequestError(
            f"status: {where.status!r} is neither a status code nor a class such as 4xx",
            param="status",
        )
