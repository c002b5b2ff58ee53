"""The shared tier of a multi-node cluster: one Redis for every router replica. An entry is a
string with Redis's own expiry (PX); an index of expiries (a sorted set) keeps at most
max_entries, dropping the oldest, in the same server-side script as the write. The client never
retries: the cache's caller bounds the wait and treats a failure as a miss, and the next call
after a failure opens a new connection."""

from __future__ import annotations

from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from deployments.ingress.cache.store import StoreUnavailable

# KEYS: the entry, the index, its mark. ARGV: the value, its time to live (ms), max_entries, the
# token whose mark goes with the write ("": none). The expiry in the index is the server's clock,
# as PX is: clocks of the router nodes play no part.
PUT_SCRIPT = """
if ARGV[4] ~= '' and redis.call('GET', KEYS[3]) == ARGV[4] then
  redis.call('DEL', KEYS[3])
end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local ttl_ms = tonumber(ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl_ms)
redis.call('ZADD', KEYS[2], now_ms + ttl_ms, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[3])
if excess > 0 then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, excess - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, excess - 1)
  redis.call('DEL', unpack(oldest))
end
return excess
"""
# KEYS: the entry, its mark. ARGV: the mark's token, its time to live (ms). The entry if stored,
# else 1 when the mark is now the token's, 0 when another holds it: get then claim, atomically.
GET_OR_CLAIM_SCRIPT = """
local value = redis.call('GET', KEYS[1])
if value then
  return value
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
"""
# KEYS: the mark. ARGV: its holder's token. Deletes the mark only if that holder still holds it.
RELEASE_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""
# KEYS: the mark. ARGV: its holder's token, its new time to live (ms). Extends the mark only if
# that holder still holds it.
RENEW_SCRIPT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
# The entry format's version is in its keys: a new format never reads the old one's entries.
FORMAT = "v1:"


class RedisStore:
    name = "redis"

    def __init__(
        self,
        url: str,
        *,
        password: str | None,
        key_prefix: str,
        max_entries: int,
        timeout_ms: float,
    ):
        options: dict[str, Any] = {"password": password} if password is not None else {}
        self._client = Redis.from_url(
            url,
            socket_timeout=timeout_ms / 1000,
            socket_connect_timeout=timeout_ms / 1000,
            retry=Retry(NoBackoff(), 0),
            **options,
        )
        self._put_script = self._client.register_script(PUT_SCRIPT)
        self._release_script = self._client.register_script(RELEASE_SCRIPT)
        self._get_or_claim_script = self._client.register_script(GET_OR_CLAIM_SCRIPT)
        self._renew_script = self._client.register_script(RENEW_SCRIPT)
        self._prefix = key_prefix + FORMAT
        self._index = self._prefix + "index"
        self.max_entries = max_entries

    async def get(self, key: str) -> bytes | None:
        try:
            value = await self._client.get(self._prefix + key)
        except (RedisError, OSError) as error:
            raise StoreUnavailable(f"redis: {error}") from error
        return cast(bytes | None, value)  # bytes: the client does not decode responses

    async def put(self, key: str, value: bytes, ttl_s: float, release_token: str = "") -> None:
        ttl_ms = max(1, round(ttl_s * 1000))
        try:
            await self._put_script(
                keys=[self._prefix + key, self._index, self._mark(key)],
                args=[value, ttl_ms, self.max_entries, release_token],
            )
        except (RedisError, OSError) as error:
            raise StoreUnavailable(f"redis: {error}") from error

    async def claim(self, key: str, token: str, ttl_s: float) -> bool:
        ttl_ms = max(1, round(ttl_s * 1000))
        try:  # SET NX PX: the mark's life is the server's clock, as an entry's is
            return bool(await self._client.set(self._mark(key), token, nx=True, px=ttl_ms))
        except (RedisError, OSError) as error:
            raise StoreUnavailable(f"redis: {error}") from error

    async def get_or_claim(self, key: str, token: str, ttl_s: float) -> bytes | bool:
        ttl_ms = max(1, round(ttl_s * 1000))
        try:
            found = await self._get_or_claim_script(
                keys=[self._prefix + key, self._mark(key)], args=[token, ttl_ms]
            )
        except (RedisError, OSError) as error:
            raise StoreUnavailable(f"redis: {error}") from error
        return found if isinstance(found, bytes) else bool(found)

    async def renew(self, key: str, token: str, ttl_s: float) -> bool:
        ttl_ms = max(1, round(ttl_s * 1000))
        try:
            renewed = await self._renew_script(keys=[self._mark(key)], args=[token, ttl_ms])
        except (RedisError, OSError) as error:
            raise StoreUnavailable(f"redis: {error}") from error
        return bool(renewed)

    async def release(self, key: str, token: str) -> None:
        try:
            await self._release_script(keys=[self._mark(key)], args=[token])
        except (RedisError, OSError) as error:
            raise StoreUnavailable(f"redis: {error}") from error

    def _mark(self, key: str) -> str:
        return self._prefix + "mark:" + key  # keys are hex digests: never "mark:..." themselves

    async def close(self) -> None:
        await self._client.aclose()
