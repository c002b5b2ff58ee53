"""Budgets of virtual keys: a request of a key with a budget reserves its estimated cost before
it is served, and is refused (429 budget_exceeded, Retry-After to the period's end) or sent to
the key's fallback model when the budget cannot hold it. The settlement (the real cost in, the
reservation out) rides with the request's ledger record (request_log.py).

With `budget_when_store_down: lease` (the default) the reservation comes out of this router
replica's lease of the key's budget, in memory (leases.py): a request waits on the database only
when the lease is short, and past it while the database does not answer it is refused (503
budget_unverifiable). With `admit` or `refuse` each request reserves in the database itself,
waiting at most `budget_reserve_timeout_s`; past it, or with the database down, it is admitted
(its cost settled once the database is back, unbounded) or refused (503)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from deployments.config.state import BudgetWhenStoreDown
from deployments.errors import (
    BudgetExceededError,
    BudgetUnverifiableError,
    StateUnavailableError,
)
from deployments.ingress.security import Principal
from deployments.ingress.state.database import StoreUnavailable
from deployments.ingress.state.leases import BudgetLeases
from deployments.ingress.state.spend import KeySpend, period_of
from deployments.observability import ModelPrice

UNCHECKED_LOG_EVERY = 1000


@dataclass(frozen=True)
class SpendAdmission:
    """What admission decided for a key's budget: the model that serves the request (the
    fallback past the budget), the period its cost counts in, what it reserved."""

    model: str
    period: str | None = None  # None: the key has no budget
    reserved_cost_units: float = 0.0


class BudgetGuard:
    def __init__(
        self,
        spend: KeySpend,
        prices: Mapping[str, ModelPrice],
        *,
        reserve_timeout_s: float,
        when_store_down: BudgetWhenStoreDown,
        leases: BudgetLeases | None = None,
        wall_clock: Callable[[], float] = time.time,
        log: logging.Logger | None = None,
    ):
        self._spend = spend
        self._prices = dict(prices)
        self._timeout_s = reserve_timeout_s
        self._when_down = when_store_down
        if (leases is None) != (when_store_down != "lease"):
            raise ValueError("budget leases are given exactly when budget_when_store_down: lease")
        self.leases = leases
        self._wall_clock = wall_clock
        self._log = log or logging.getLogger("ray.serve")
        self.unchecked = 0  # requests admitted while the database could not say

    def estimated_cost(self, model: str, input_tokens: int, output_tokens: int) -> float:
        price = self._prices.get(model)
        return 0.0 if price is None else price.cost(input_tokens, output_tokens)

    async def admit(
        self, principal: Principal, model: str, input_tokens: int, output_tokens: int
    ) -> SpendAdmission:
        """Reserve the request's estimated cost of the key's budget, or decide what else."""
        budget = principal.budget
        if budget is None:
            return SpendAdmission(model)
        now = self._wall_clock()
        period, ends_at = period_of(budget.period, now)
        estimate = self.estimated_cost(model, input_tokens, output_tokens)
        if self.leases is not None:
            admitted = await self._take_from_lease(principal, period, ends_at, estimate)
        else:
            try:
                admitted = await asyncio.wait_for(
                    self._spend.reserve(principal.key_id, period, estimate, budget.cost_units),
                    self._timeout_s,
                )
            except (StoreUnavailable, TimeoutError) as error:
                return self._store_down(principal, model, period, error)
        if admitted:
            return SpendAdmission(model, period, estimate)
        if budget.fallback_model is not None:
            return SpendAdmission(budget.fallback_model, period)
        raise BudgetExceededError(
            f"key {principal.key_id} has spent its budget of {budget.cost_units:g} cost units "
            f"per {budget.period} (this request needs about {estimate:.6g}); it renews at the "
            "period's end",
            retry_after_s=ends_at - now,
        )

    async def _take_from_lease(
        self, principal: Principal, period: str, ends_at: float, estimate: float
    ) -> bool:
        assert self.leases is not None and principal.budget is not None
        try:
            return await self.leases.take(
                principal.key_id, period, ends_at, principal.budget.cost_units, estimate
            )
        except StoreUnavailable:
            raise BudgetUnverifiableError(
                f"cannot verify key {principal.key_id}'s budget: this router's lease of it does "
                f"not hold this request (about {estimate:.6g} cost units) and the gateway's "
                "database does not answer",
                retry_after_s=self.leases.retry_after_s,
            ) from None

    def _store_down(
        self, principal: Principal, model: str, period: str, error: BaseException
    ) -> SpendAdmission:
        if self._when_down == "refuse":
            raise StateUnavailableError(
                "cannot check this key's budget: the gateway's database does not answer"
            )
        self.unchecked += 1
        if self.unchecked % UNCHECKED_LOG_EVERY == 1:  # the first of an outage, then 1 in N
            self._log.warning(
                "state: budgets unchecked (%s), %d requests admitted so far: their cost is "
                "settled once the database answers",
                type(error).__name__,
                self.unchecked,
            )
        return SpendAdmission(model, period)
