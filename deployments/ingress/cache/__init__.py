"""The router's exact-match response cache (AI-gateway style) for deterministic requests: keys
per request and credentials, an optional in-process tier, and one store shared by the router
replicas (SQLite per node, or Redis per cluster), where a miss is made once for every identical
request waiting on it; docs/edge.md, "The response cache"."""

from deployments.ingress.cache.backends import REDIS_PASSWORD_ENV, REDIS_URL_ENV, open_cache_store
from deployments.ingress.cache.keys import cache_key, wants_bypass
from deployments.ingress.cache.response_cache import ResponseCache
from deployments.ingress.cache.single_flight import SingleFlight
from deployments.ingress.cache.store import SharedStore, StoreUnavailable

__all__ = [
    "REDIS_PASSWORD_ENV",
    "REDIS_URL_ENV",
    "ResponseCache",
    "SharedStore",
    "SingleFlight",
    "StoreUnavailable",
    "cache_key",
    "open_cache_store",
    "wants_bypass",
]
