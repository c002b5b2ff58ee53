"""Which shared backend the response cache uses: the one `router.cache` names, with the Redis
address or password from the router's environment (a Secret on Kubernetes)."""

from __future__ import annotations

from collections.abc import Mapping

from deployments.config import AppConfig
from deployments.ingress.cache.store import SharedStore

REDIS_URL_ENV = "EDGE_REDIS_URL"  # the whole URL, a password included: replaces redis_url
REDIS_PASSWORD_ENV = "EDGE_REDIS_PASSWORD"  # the password of the config's redis_url


def open_cache_store(config: AppConfig, environ: Mapping[str, str]) -> SharedStore | None:
    """The backend `router.cache` names, not yet connected (each connects on first use and again
    after a failure); None for `memory` or a disabled cache. `environ`: the router's, for the
    Redis URL or password."""
    cache = config.router.cache
    if not cache.enabled or cache.backend == "memory":
        return None
    # A backend's driver is imported only where it is the one used.
    if cache.backend == "sqlite":
        from deployments.ingress.cache.sqlite_store import SQLiteStore

        return SQLiteStore(config.data_path(cache.sqlite_file), cache.max_entries, cache.timeout_ms)
    from deployments.ingress.cache.redis_store import RedisStore

    url = environ.get(REDIS_URL_ENV) or cache.redis_url
    if not url:
        raise ValueError(
            f"router.cache.backend is redis: set router.cache.redis_url or {REDIS_URL_ENV}"
        )
    return RedisStore(
        url,
        password=None if environ.get(REDIS_URL_ENV) else environ.get(REDIS_PASSWORD_ENV),
        key_prefix=cache.redis_key_prefix,
        max_entries=cache.max_entries,
        timeout_ms=cache.timeout_ms,
    )
