"""The router's edge layer: each model call goes through a colo of the simulated network - the
nearest healthy one, or a warm one close enough - with its RTT acted out, and fails over to the
next colo when one is down, erroring or slow. Cold starts are measured from the replies."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from deployments.errors import (
    BadHeaderValueError,
    OverloadedError,
    ServingError,
)
from deployments.servers.base import Reply
from edge_sim.geo import BadHeaderError, ClientLocation
from edge_sim.network import EdgeNetwork
from edge_sim.routing import NoColoAvailableError, RouteCandidate

T = TypeVar("T")


class InjectedFaultError(Exception):
    """A fault drill made this colo fail the request."""


@dataclass
class EdgeTrace:
    """Where a request went and why; becomes the x-edge-* response headers."""

    colo: str
    rtt_ms: float
    reason: str
    tried: list[str] = field(default_factory=list)
    cold_start_ms: float | None = None
    cache: str | None = None
    client: ClientLocation | None = None
    cold_start_phases: dict[str, float | None] | None = None  # of the replica it waited on

    def headers(self) -> dict[str, str]:
        headers = {
            "x-edge-colo": self.colo,
            "x-edge-rtt-ms": f"{self.rtt_ms:.1f}",
            "x-edge-route-reason": self.reason,
            "x-edge-cold-start": "1" if self.cold_start_ms is not None else "0",
        }
        if self.reason == "failover":
            headers["x-edge-failover"] = ",".join(self.tried)
        if self.cold_start_ms is not None:
            headers["x-edge-cold-start-ms"] = f"{self.cold_start_ms:.0f}"
        if self.cache is not None:
            headers["x-edge-cache"] = self.cache
        return headers


class WarmthTracker:
    """Which colos have a model warm, and how long the model's cold start takes.

    A colo is warm for a model when it served it within `warm_window_s` (the model's replicas
    outlive that window only under traffic). When a request skips its nearest colo because that
    one is cold, the nearest colo starts warming and counts as warm one cold start later - as an
    edge platform warms the local colo while a neighbour serves. Cold starts are learned from
    replies whose replica became ready after the request arrived (an EWMA, seeded by config).
    """

    def __init__(self, warm_window_s: float, default_cold_start_ms: float, clock=time.monotonic):
        self._window_s = warm_window_s
        self._default_ms = default_cold_start_ms
        self._clock = clock
        self._last_served: dict[tuple[str, str], float] = {}
        self._warm_from: dict[tuple[str, str], float] = {}
        self._cold_ms: dict[str, float] = {}
        self.last_cold_start: dict[str, dict[str, Any]] = {}

    def is_warm(self, colo_id: str, model: str) -> bool:
        now = self._clock()
        warming_done = self._warm_from.get((colo_id, model))
        if warming_done is not None and warming_done <= now:
            del self._warm_from[(colo_id, model)]
            self._last_served[(colo_id, model)] = warming_done
        served = self._last_served.get((colo_id, model))
        return served is not None and now - served < self._window_s

    def start_warming(self, colo_id: str, model: str) -> None:
        key = (colo_id, model)
        if key not in self._warm_from:
            self._warm_from[key] = self._clock() + self.cold_start_ms(model) / 1000.0

    def cold_start_ms(self, model: str) -> float:
        return self._cold_ms.get(model, self._default_ms)

    def record(self, colo_id: str, model: str, reply: Reply, arrived_at: float) -> float | None:
        """Note a served request; returns the cold-start wait in ms if it waited on one."""
        self._last_served[(colo_id, model)] = self._clock()
        waited_s = reply.replica_ready_at - arrived_at
        if waited_s <= 0:
            return None
        waited_ms = waited_s * 1000.0
        previous = self._cold_ms.get(model)
        self._cold_ms[model] = waited_ms if previous is None else 0.7 * previous + 0.3 * waited_ms
        self.last_cold_start[model] = {
            "at_unix": time.time(),
            "wait_ms": waited_ms,
            "replica_load_s": reply.replica_load_s,
            "phases": reply.phases.as_dict() if reply.phases else None,
        }
        return waited_ms


class EdgeDispatcher(Generic[T]):
    """Runs one model call through the edge: route, delay, call, fail over, account."""

    def __init__(self, network: EdgeNetwork, warmth: WarmthTracker, max_attempts: int):
        self.network = network
        self.warmth = warmth
        self.max_attempts = max_attempts

    def plan(self, model: str, headers: Mapping[str, str], client_ip: str | None):
        try:
            return self.network.route(
                model,
                headers,
                client_ip,
                is_warm=self.warmth.is_warm,
                cold_start_ms=self.warmth.cold_start_ms,
            )
        except BadHeaderError as exc:
            raise BadHeaderValueError(exc.message, header=exc.header) from None
        except NoColoAvailableError as exc:
            raise OverloadedError(exc.message, retry_after_s=5) from None

    async def nearest(
        self, model: str, headers: Mapping[str, str], client_ip: str | None
    ) -> EdgeTrace:
        """The colo that answers from its cache: the first choice, with its RTT acted out."""
        plan = self.plan(model, headers, client_ip)
        first = plan.candidates[0]
        await asyncio.sleep(self.network.delay_s(first))
        return EdgeTrace(
            first.colo_id, first.rtt_ms, first.reason, [first.colo_id], client=plan.client
        )

    async def dispatch(
        self,
        model: str,
        headers: Mapping[str, str],
        client_ip: str | None,
        call: Callable[[], Awaitable[T]],
        reply_of: Callable[[T], Reply],
        deadline_s: float,
    ) -> tuple[T, EdgeTrace]:
        plan = self.plan(model, headers, client_ip)
        arrived_at = time.time()
        deadline = time.monotonic() + deadline_s
        tried: list[str] = []
        failed = False
        last_error: ServingError | None = None
        candidates = plan.candidates[: self.max_attempts]
        for index, candidate in enumerate(candidates):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            # A hung colo gets its share of the deadline, not all of it: the rest can still try.
            attempt_s = remaining / (len(candidates) - index)
            if not self.network.try_acquire(candidate.colo_id):
                continue  # full, ejected or gone down since the plan: spill to the next
            tried.append(candidate.colo_id)
            ok: bool | None = None
            try:
                # A timeout scope, not wait_for: that wraps every attempt in a Task of its own.
                async with asyncio.timeout(attempt_s):
                    result = await self._attempt(candidate, call)
                ok = True
            except ServingError as error:
                if error.status < 500:
                    ok = True  # the client's mistake, not the colo's: no failover
                    raise
                ok, failed, last_error = False, True, error
                continue
            except (InjectedFaultError, TimeoutError) as error:
                ok, failed = False, True
                last_error = OverloadedError(
                    f"colo {candidate.colo_id} failed: {type(error).__name__}", retry_after_s=1
                )
                continue
            finally:
                self.network.release(candidate.colo_id, ok)
            reply = reply_of(result)
            if candidate.reason == "warm":
                nearest = min(plan.candidates, key=lambda c: c.rtt_ms)
                self.warmth.start_warming(nearest.colo_id, model)
            cold_start_ms = self.warmth.record(candidate.colo_id, model, reply, arrived_at)
            trace = EdgeTrace(
                candidate.colo_id,
                candidate.rtt_ms,
                "failover" if failed else self._reason(candidate, plan.candidates[0]),
                tried,
                cold_start_ms,
                client=plan.client,
                cold_start_phases=(
                    reply.phases.as_dict() if cold_start_ms is not None and reply.phases else None
                ),
            )
            return result, trace
        if last_error is not None:
            raise last_error
        raise OverloadedError(
            f"no colo could take a {model} request (tried {tried or 'none'})", retry_after_s=1
        )

    async def _attempt(self, candidate: RouteCandidate, call: Callable[[], Awaitable[T]]) -> T:
        delay_s = self.network.delay_s(candidate)
        if delay_s > 0:  # sleep(0) would still cost a round of the event loop
            await asyncio.sleep(delay_s)
        if self.network.should_fail(candidate.colo_id):
            raise InjectedFaultError(candidate.colo_id)
        return await call()

    @staticmethod
    def _reason(chosen: RouteCandidate, first: RouteCandidate) -> str:
        return chosen.reason if chosen is first else "spillover"
