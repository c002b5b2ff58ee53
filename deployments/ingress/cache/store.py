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

    async def put(self, key: str, value: bytes, ttl_s: float) -> None: ...

    async def close(self) -> None: ...
