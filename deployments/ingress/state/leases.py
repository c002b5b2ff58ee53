"""Budget leases: each router replica holds, per active key and budget period, a slice of the
key's remaining budget reserved in the database ahead of need (`key_spend.reserved`, where a
request's reservation goes too) and admits the key's requests from it in memory, with no round
trip. A lease that runs low is topped up in the background; while the database does not answer,
a replica spends only what it holds, so a key is never admitted beyond what was reserved within
its budget, and a request its lease cannot hold is refused (503 budget_unverifiable).

A request takes its estimated cost out of the lease; its ledger record settles that as any
reservation (reserved - estimate, spent + cost), so once the database is back the write-behind's
records are all there is to reconcile. A lease no request used for `idle_s`, or of a period that
has ended, goes back to the database, and so does every lease when the replica stops."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from deployments.config.state import BudgetLeaseConfig
from deployments.ingress.state.database import StoreUnavailable
from deployments.ingress.state.spend import KeySpend
from deployments.ingress.state.write_behind import METRIC_PREFIX
from deployments.observability.metrics_backend import MetricsBackend

# A top-up reads what the budget holds, then reserves its slice only if it still fits: another
# replica reserving in between makes it read again, a few times at most.
TOP_UP_TRIES = 3
# Less than this is float dust left by many additions and subtractions, not budget.
DUST_COST_UNITS = 1e-12


@dataclass
class Lease:
    key_id: str
    period: str
    ends_at: float  # the wall-clock second its budget period ends
    budget: float  # the key's budget as its last request saw it
    used_at: float  # this replica's clock at its last request
    balance: float = 0.0  # reserved in the database, not yet taken by a request
    slice: float = 0.0  # its last top-up: below `refill_below` of it, the next one starts
    top_up: asyncio.Task[StoreUnavailable | None] | None = None


class LeaseMetrics:
    """Leases out and spend not yet settled, per router replica."""

    def __init__(self, backend: MetricsBackend):
        self.leased = backend.gauge(
            METRIC_PREFIX + "budget_leased_cost_units",
            "Budget this router replica holds in leases: reserved, not yet taken by a request",
            (),
        )
        self.unsettled = backend.gauge(
            METRIC_PREFIX + "budget_unsettled_cost_units",
            "Budget taken by this replica's requests (their estimates) not yet settled by their "
            "ledger records",
            (),
        )
        self.unverifiable = backend.counter(
            METRIC_PREFIX + "budget_unverifiable_total",
            "Requests refused: past this replica's lease while the database did not answer",
            (),
        )


class BudgetLeases:
    def __init__(
        self,
        spend: KeySpend,
        config: BudgetLeaseConfig,
        *,
        wait_s: float,
        metrics: LeaseMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        log: logging.Logger | None = None,
    ):
        self._spend = spend
        self._config = config
        self._wait_s = wait_s
        self._metrics = metrics
        self._clock = clock
        self._wall_clock = wall_clock
        self._log = log or logging.getLogger("ray.serve")
        self._leases: dict[tuple[str, str], Lease] = {}
        self._down_until = -math.inf  # after a failed top-up: refuse at once, don't ask again
        self._failing = False
        self.unsettled = 0.0
        self.refused = 0

    @property
    def leased(self) -> float:
        """Cost units this replica holds in leases."""
        return sum(lease.balance for lease in self._leases.values())

    def lease_of(self, key_id: str, period: str) -> float:
        lease = self._leases.get((key_id, period))
        return 0.0 if lease is None else lease.balance

    @property
    def retry_after_s(self) -> float:
        return self._config.refresh_interval_s

    async def take(
        self, key_id: str, period: str, ends_at: float, budget: float, amount: float
    ) -> bool:
        """Take `amount` out of this replica's lease of the key's budget for `period`: True when
        the lease holds it (topped up first when short), False when the budget cannot hold it.
        StoreUnavailable when the lease is short and the database does not answer in time."""
        lease = self._leases.get((key_id, period))
        if lease is None:
            lease = Lease(key_id, period, ends_at, budget, self._clock())
            self._leases[(key_id, period)] = lease
        lease.budget, lease.used_at = budget, self._clock()
        if lease.balance < amount:
            try:
                await self._wait_for_top_up(lease, amount)
            except StoreUnavailable:
                self.refused += 1
                if self._metrics is not None:
                    self._metrics.unverifiable.inc(1, {})
                raise
            if lease.balance < amount:
                return False
        lease.balance -= amount
        self.unsettled += amount
        if lease.top_up is None and lease.balance < self._config.refill_below * lease.slice:
            self._start_top_up(lease, 0.0)  # ahead of need: the next request finds it full
        return True

    def settled(self, reserved: float) -> None:
        """Ledger records written: the estimates they took out of leases are settled."""
        self.unsettled = max(0.0, self.unsettled - reserved)
        self._report()

    async def _wait_for_top_up(self, lease: Lease, amount: float) -> None:
        if self._clock() < self._down_until:
            raise StoreUnavailable("the database did not answer this replica's last top-up")
        try:
            async with asyncio.timeout(self._wait_s):
                for _ in range(2):  # one top-up under way (the background's), then ours
                    ours = lease.top_up is None
                    task = lease.top_up or self._start_top_up(lease, amount - lease.balance)
                    # Shielded: a top-up that outlives this wait still lands in the lease.
                    error = await asyncio.shield(task)
                    if error is not None:
                        raise StoreUnavailable(str(error))
                    if ours or lease.balance >= amount:
                        return
        except TimeoutError:
            raise StoreUnavailable(f"no lease top-up within {self._wait_s:g} s") from None

    def _start_top_up(self, lease: Lease, need: float) -> asyncio.Task[StoreUnavailable | None]:
        lease.top_up = asyncio.get_running_loop().create_task(self._top_up(lease, need))
        return lease.top_up

    async def _top_up(self, lease: Lease, need: float) -> StoreUnavailable | None:
        """Reserve a slice of what the key's budget still holds (at least `need`) into the
        lease; the failure, returned rather than raised, when the database does not answer."""
        try:
            for _ in range(TOP_UP_TRIES):
                remaining = await self._spend.remaining(lease.key_id, lease.period, lease.budget)
                grant = min(max(self._slice(remaining), need), remaining)
                if grant < max(need, DUST_COST_UNITS):
                    break  # the budget cannot hold it
                if await self._spend.reserve(lease.key_id, lease.period, grant, lease.budget):
                    lease.balance += grant
                    lease.slice = grant
                    break
        except StoreUnavailable as error:
            self._went_down(error)
            return error
        finally:
            lease.top_up = None
        self._came_back()
        self._report()
        return None

    def _slice(self, remaining: float) -> float:
        config = self._config
        size = max(config.fraction * remaining, config.min_cost_units)
        return size if config.max_cost_units is None else min(size, config.max_cost_units)

    async def maintain(self) -> None:
        """One round of the background work: leases idle for `idle_s` or of an ended period go
        back, those below `refill_below` of their slice are topped up. A round stops at the
        database's first failure; the next one tries again."""
        now, wall = self._clock(), self._wall_clock()
        try:
            for key, lease in list(self._leases.items()):
                if lease.top_up is not None:
                    continue
                if wall >= lease.ends_at or now - lease.used_at >= self._config.idle_s:
                    await self._give_back(key)
                elif (
                    lease.balance < self._config.refill_below * lease.slice
                    and await self._start_top_up(lease, 0.0) is not None
                ):
                    break  # the database is away: the next round asks again
        except StoreUnavailable as error:
            self._went_down(error)
        self._report()

    async def _give_back(self, key: tuple[str, str]) -> None:
        lease = self._leases.pop(key)
        # Zeroed before the await: a request meanwhile opens a new lease, never spends this.
        amount, lease.balance = lease.balance, 0.0
        if amount <= 0:
            return
        try:
            await self._spend.release(lease.key_id, lease.period, amount)
        except StoreUnavailable:
            self._leases.setdefault(key, lease).balance += amount
            raise

    async def top_ups_done(self) -> None:
        """Wait for the top-ups under way (their statements are bounded by the database's
        timeouts)."""
        for lease in list(self._leases.values()):
            if lease.top_up is not None:
                await asyncio.shield(lease.top_up)

    async def close(self) -> None:
        """At shutdown: every lease goes back. What the database does not take stays reserved
        until its period ends (it errs towards refusing, never towards overspending)."""
        await self.top_ups_done()  # their grants land, then go back
        try:
            for key in list(self._leases):
                await self._give_back(key)
        except StoreUnavailable as error:
            self._log.warning(
                "state: %.6g cost units of budget leases not returned (%s): they stay reserved "
                "until their periods end",
                self.leased,
                error,
            )
        self._report()

    def _went_down(self, error: StoreUnavailable) -> None:
        self._down_until = self._clock() + self._config.refresh_interval_s
        if not self._failing:
            self._log.warning(
                "state: budget leases cannot be topped up (%s): keys spend only their leases, "
                "%.6g cost units held",
                error,
                self.leased,
            )
        self._failing = True

    def _came_back(self) -> None:
        self._down_until = -math.inf
        if self._failing:
            self._log.info("state: budget leases are topped up again")
        self._failing = False

    def _report(self) -> None:
        if self._metrics is not None:
            self._metrics.leased.set(self.leased, {})
            self._metrics.unsettled.set(self.unsettled, {})
