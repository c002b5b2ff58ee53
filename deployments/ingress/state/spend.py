"""Spend per key and budget period (table `key_spend`): the atomic reservation that admits a
request of a key with a budget, and the settlement that replaces it with the request's cost.

A reservation is one conditional upsert: it adds the request's estimated cost to `reserved`
only if `spent + reserved + estimate` stays within the budget, so router replicas that reserve
at the same time can never admit together more than the budget holds. Only requests in flight
whose real cost exceeds their estimate can overshoot it (docs/gateway-state.md)."""

from __future__ import annotations

import calendar
from dataclasses import dataclass
from datetime import UTC, datetime

from deployments.config.security import BudgetPeriod
from deployments.ingress.state.database import Database

_RESERVE = """
INSERT INTO key_spend (key_id, period, spent, reserved)
SELECT ?, ?, 0, CAST(? AS DOUBLE PRECISION) WHERE CAST(? AS DOUBLE PRECISION) <= ?
ON CONFLICT (key_id, period) DO UPDATE SET reserved = key_spend.reserved + excluded.reserved
WHERE key_spend.spent + key_spend.reserved + excluded.reserved <= ?
RETURNING spent, reserved
"""
# A record's settlement: its reservation released and its cost added (an upsert, since a
# request admitted while the store was down reserved nothing).
SETTLE_SQL = """
INSERT INTO key_spend (key_id, period, spent, reserved) VALUES (?, ?, ?, ?)
ON CONFLICT (key_id, period) DO UPDATE SET spent = key_spend.spent + excluded.spent,
reserved = key_spend.reserved + excluded.reserved
"""


# A lease's unspent slice given back (budget leases, leases.py).
_RELEASE = "UPDATE key_spend SET reserved = reserved - ? WHERE key_id = ? AND period = ?"


def period_of(period: BudgetPeriod, now_s: float) -> tuple[str, float]:
    """The budget period `now_s` falls in, by UTC calendar: its name (2026-12-02, 2026-12) and
    the wall-clock second it ends."""
    now = datetime.fromtimestamp(now_s, UTC)
    if period == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.strftime("%Y-%m-%d"), start.timestamp() + 86_400
    days = calendar.monthrange(now.year, now.month)[1]
    start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return start.strftime("%Y-%m"), start.timestamp() + days * 86_400


@dataclass(frozen=True)
class PeriodSpend:
    spent: float
    reserved: float


class KeySpend:
    def __init__(self, database: Database):
        self._db = database

    async def reserve(self, key_id: str, period: str, amount: float, budget: float) -> bool:
        """Reserve `amount` of the key's budget for this period, if it still holds it."""
        found = await self._db.fetch(_RESERVE, (key_id, period, amount, amount, budget, budget))
        return bool(found)

    async def remaining(self, key_id: str, period: str, budget: float) -> float:
        """What the key's budget still holds this period, neither spent nor reserved."""
        found = await self._db.fetch(
            "SELECT spent, reserved FROM key_spend WHERE key_id = ? AND period = ?",
            (key_id, period),
        )
        return budget - sum(float(spent) + float(reserved) for spent, reserved in found)

    async def release(self, key_id: str, period: str, amount: float) -> None:
        """Give back `amount` reserved and not spent (a lease returned)."""
        await self._db.execute(_RELEASE, (amount, key_id, period))

    async def of_period(self, period_by_key: dict[str, str]) -> dict[str, PeriodSpend]:
        """Each key's spend in the period named for it (keys with none yet are left out)."""
        if not period_by_key:
            return {}
        rows = await self._db.fetch(
            "SELECT key_id, period, spent, reserved FROM key_spend WHERE key_id IN "
            f"({', '.join('?' for _ in period_by_key)})",
            list(period_by_key),
        )
        return {
            key: PeriodSpend(float(spent), float(reserved))
            for key, period, spent, reserved in rows
            if period_by_key.get(key) == period
        }
