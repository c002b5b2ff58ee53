"""Waiting in an event loop with a deadline, for a unit test whose condition is met by another
thread or a real server: the one place beside edgectl.local_cluster.wait_until (its blocking
twin) where a unit test's wait touches the wall clock (tests/unit/test_no_sleeps.py)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable


async def until(
    condition: Callable[[], object], timeout_s: float, what: str, every_s: float = 0.005
) -> None:
    """Poll `condition()` (or the awaitable it returns) every `every_s` until it is truthy;
    TimeoutError naming `what`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await _value(condition()):
        if asyncio.get_running_loop().time() >= deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(every_s)


async def _value(result: object) -> object:
    return await result if inspect.isawaitable(result) else result
