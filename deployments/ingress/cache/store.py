"""The shared tier of the response cache: what a backend does (`SharedStore`) and how it fails
(`StoreUnavailable`)."""

from __future__ import annotations

from typing import Protocol


class StoreUnavailable(RuntimeError):
    """The backend did not answer (down, refused, disk error): the lookup is a miss."""


class SharedStore(Protocol):
    """Bytes by key with a time to live, seen by every router replica that opens the same
    backend. Failures raise StoreUnavailable; the caller bounds the wait."""

    name: str  # the backend, as the failure metric labels it

    async def get(self, key: str) -> bytes | None: ...

    async def put(self, key: str, value: bytes, ttl_s: float, release_token: str = "") -> None:
        """Store `value` for ttl_s; `release_token`: its mark on the key, removed with the write
        if it still holds it (a lead's answer in and its mark out, in one call)."""
        ...

    async def claim(self, key: str, token: str, ttl_s: float) -> bool:
        """Set the key's "being made" mark, held by `token` for ttl_s, unless another holds one
        still alive: True when this caller now holds it (single_flight.py)."""
        ...

    async def get_or_claim(self, key: str, token: str, ttl_s: float) -> bytes | bool:
        """`get`, else `claim`, as one call: the key's value if stored, else whether `token`
        now holds its mark. An entry written meanwhile is returned, never claimed over."""
        ...

    async def renew(self, key: str, token: str, ttl_s: float) -> bool:
        """Give the key's mark ttl_s more from now if `token` still holds it: False when it
        does not (it ended, and maybe another took it)."""
        ...

    async def release(self, key: str, token: str) -> None:
        """Remove the key's mark if `token` still holds it."""
        ...

    async def close(self) -> None: ...
