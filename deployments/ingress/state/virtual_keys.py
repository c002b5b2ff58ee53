"""Virtual keys (table `api_keys`): created, listed, revoked and rotated through the admin API;
only a key's SHA-256 digest is stored, and its secret is shown once, when it is made. Every
change bumps the `api_keys` version in the same transaction, which each router replica polls
to reload the table (key_follower.py)."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from deployments.config.security import BudgetPeriod, KeyBudget
from deployments.ingress.security.keys import KEY_NAME, key_digest
from deployments.ingress.state.database import Database, Row, Statements

SECRET_PREFIX = "sk-edge-"
SECRET_BYTES = 32  # 256 random bits: a SHA-256 digest of it needs no salt or slow hash
ID_PREFIX = "vk-"
ID_HEX_CHARS = 12
KEYS_VERSION = "api_keys"
_COLUMNS = (
    "id, name, digest, models, requests_per_minute, tokens_per_minute, budget_cost_units, "
    "budget_period, fallback_model, collect_payloads, expires_at, created_at, revoked_at, weight"
)


class NewKey(BaseModel):
    """POST /admin/keys: what a new key may do. Null limits fall back to security's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=KEY_NAME.pattern)
    models: list[str] | None = Field(default=None, description="allowed models; null: all")
    requests_per_minute: int | None = Field(default=None, ge=1, le=10_000_000)
    tokens_per_minute: int | None = Field(default=None, ge=1, le=10_000_000_000)
    weight: float | None = Field(
        default=None, gt=0, le=1000, description="its share of a full model against other keys'"
    )
    budget: KeyBudget | None = None
    expires_at: float | None = Field(default=None, gt=0, description="unix seconds")
    collect_payloads: bool = Field(
        default=False, description="store request payloads in the request log"
    )

    @model_validator(mode="after")
    def _models_listed_once(self) -> Self:
        if self.models is not None and len(set(self.models)) != len(self.models):
            raise ValueError("models: a model is listed twice")
        return self


@dataclass(frozen=True)
class VirtualKey:
    id: str
    name: str
    digest: str  # hex SHA-256 of the secret
    models: tuple[str, ...] | None
    requests_per_minute: int | None
    tokens_per_minute: int | None
    budget_cost_units: float | None
    budget_period: BudgetPeriod | None
    fallback_model: str | None
    collect_payloads: bool
    expires_at: float | None
    created_at: float
    revoked_at: float | None
    weight: float | None = None

    @classmethod
    def from_row(cls, row: Row) -> VirtualKey:
        (key_id, name, digest, models, rpm, tpm, budget, period, fallback, payloads, expires,
         created, revoked, weight) = row  # fmt: skip
        return cls(
            key_id, name, digest, None if models is None else tuple(json.loads(models)),
            rpm, tpm, budget, period, fallback, bool(payloads), expires, created, revoked, weight,
        )  # fmt: skip

    @property
    def budget(self) -> KeyBudget | None:
        if self.budget_cost_units is None or self.budget_period is None:
            return None
        return KeyBudget(
            cost_units=self.budget_cost_units,
            period=self.budget_period,
            fallback_model=self.fallback_model,
        )

    def expired(self, now_s: float) -> bool:
        return self.expires_at is not None and now_s >= self.expires_at

    def public(self, now_s: float) -> dict[str, Any]:
        """What GET /admin/keys shows: everything but the digest."""
        status = "revoked" if self.revoked_at else "expired" if self.expired(now_s) else "active"
        budget = self.budget
        return {
            "id": self.id,
            "name": self.name,
            "status": status,
            "models": None if self.models is None else list(self.models),
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
            "weight": self.weight,
            "budget": None if budget is None else budget.model_dump(),
            "collect_payloads": self.collect_payloads,
            "expires_at": self.expires_at,
            "created_at": self.created_at,
            "revoked_at": self.revoked_at,
        }


def new_secret() -> tuple[str, str]:
    """A key's secret and the hex digest stored for it."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)
    return secret, key_digest(secret).hex()


class VirtualKeys:
    def __init__(self, database: Database):
        self._db = database

    async def create(self, spec: NewKey, now_s: float) -> tuple[VirtualKey, str]:
        """The new key and its secret (shown once)."""
        secret, digest = new_secret()
        key_id = ID_PREFIX + secrets.token_hex(ID_HEX_CHARS // 2)
        budget = spec.budget
        row = (
            key_id,
            spec.name,
            digest,
            None if spec.models is None else json.dumps(spec.models),
            spec.requests_per_minute,
            spec.tokens_per_minute,
            budget.cost_units if budget else None,
            budget.period if budget else None,
            budget.fallback_model if budget else None,
            int(spec.collect_payloads),
            spec.expires_at,
            now_s,
            None,
            spec.weight,
        )
        async with self._db.transaction() as tx:
            await tx.execute(
                f"INSERT INTO api_keys ({_COLUMNS}) VALUES ({', '.join('?' for _ in row)})", row
            )
            await _bump(tx)
        return VirtualKey.from_row(row), secret

    async def all(self) -> list[VirtualKey]:
        rows = await self._db.fetch(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at, id")
        return [VirtualKey.from_row(row) for row in rows]

    async def unrevoked(self) -> list[VirtualKey]:
        rows = await self._db.fetch(f"SELECT {_COLUMNS} FROM api_keys WHERE revoked_at IS NULL")
        return [VirtualKey.from_row(row) for row in rows]

    async def get(self, key_id: str) -> VirtualKey | None:
        rows = await self._db.fetch(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?", (key_id,))
        return VirtualKey.from_row(rows[0]) if rows else None

    async def revoke(self, key_id: str, now_s: float) -> bool:
        """Revoke it for good; False if there is no such key. Revoking twice changes nothing."""
        async with self._db.transaction() as tx:
            found = await tx.fetch("SELECT revoked_at FROM api_keys WHERE id = ?", (key_id,))
            if not found:
                return False
            if found[0][0] is None:
                await tx.execute("UPDATE api_keys SET revoked_at = ? WHERE id = ?", (now_s, key_id))
                await _bump(tx)
        return True

    async def rotate(self, key_id: str) -> str | None:
        """A new secret for an unrevoked key (the old one stops working); None if there is
        none to rotate."""
        secret, digest = new_secret()
        async with self._db.transaction() as tx:
            changed = await tx.execute(
                "UPDATE api_keys SET digest = ? WHERE id = ? AND revoked_at IS NULL",
                (digest, key_id),
            )
            if not changed:
                return None
            await _bump(tx)
        return secret

    async def version(self) -> int:
        rows = await self._db.fetch(
            "SELECT version FROM state_versions WHERE name = ?", (KEYS_VERSION,)
        )
        return int(rows[0][0])


async def _bump(tx: Statements) -> None:
    await tx.execute(
        "UPDATE state_versions SET version = version + 1 WHERE name = ?", (KEYS_VERSION,)
    )
