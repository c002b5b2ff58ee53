"""Each router replica's copy of the virtual keys: reloaded whenever the table's version moved,
which it checks every `keys_poll_interval_s` with one indexed read. A poll, not PostgreSQL's
LISTEN/NOTIFY: the same code follows both backends, and one tiny read per replica every half
second is nothing to either; a revoked key is refused everywhere within an interval and a query.
While the database does not answer, the last copy stays in force (expiry is checked locally)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from deployments.config.security import RateLimits
from deployments.errors import AuthenticationError
from deployments.ingress.security import Principal, SecurityConfig
from deployments.ingress.state.database import StoreUnavailable
from deployments.ingress.state.virtual_keys import VirtualKey, VirtualKeys


class KeyFollower:
    """The VirtualKeyLookup of deployments.ingress.security.keys: digest -> (key, its Principal)."""

    def __init__(
        self,
        keys: VirtualKeys,
        security: SecurityConfig,
        *,
        wall_clock: Callable[[], float] = time.time,
        log: logging.Logger | None = None,
    ):
        self._keys = keys
        self._security = security
        self._wall_clock = wall_clock
        self._log = log or logging.getLogger("ray.serve")
        self._by_digest: dict[bytes, tuple[VirtualKey, Principal]] = {}
        self.version: int | None = None
        self._failing = False

    @property
    def has_keys(self) -> bool:
        return bool(self._by_digest)

    def principal_of(self, key_id: str) -> Principal | None:
        for key, principal in self._by_digest.values():
            if key.id == key_id:
                return None if key.expired(self._wall_clock()) else principal
        return None

    def principal(self, digest: bytes) -> Principal | None:
        found = self._by_digest.get(digest)
        if found is None:
            return None
        key, principal = found
        if key.expired(self._wall_clock()):
            raise AuthenticationError(f"the API key {key.id} has expired", code="expired_api_key")
        return principal

    async def refresh(self) -> bool:
        """Reload the keys if the table changed since the last load; whether it did. Raises
        StoreUnavailable when the database does not answer."""
        version = await self._keys.version()
        if version == self.version:
            return False
        keys = await self._keys.unrevoked()
        self._by_digest = {bytes.fromhex(k.digest): (k, self._principal(k)) for k in keys}
        self.version = version
        return True

    async def poll(self) -> None:
        """One refresh, its failure logged once per outage (the loaded keys stay in force)."""
        try:
            await self.refresh()
        except StoreUnavailable as error:
            if not self._failing:
                self._log.warning("state: cannot follow the keys table (%s); keeping it", error)
            self._failing = True
            return
        if self._failing:
            self._log.info("state: following the keys table again")
            self._failing = False

    def _principal(self, key: VirtualKey) -> Principal:
        """A field the key leaves null keeps security.default_limits'."""
        given = {
            name: value
            for name, value in (
                ("requests_per_minute", key.requests_per_minute),
                ("tokens_per_minute", key.tokens_per_minute),
                ("weight", key.weight),
            )
            if value is not None
        }
        limits: RateLimits = self._security.default_limits.model_copy(update=given)
        return Principal(
            key.id,
            limits,
            models=None if key.models is None else frozenset(key.models),
            budget=key.budget,
            collect_payloads=key.collect_payloads,
        )
