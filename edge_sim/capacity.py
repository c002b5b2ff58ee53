"""Per-colo in-flight request counters: a full colo turns requests away instead of queueing."""

from __future__ import annotations

from collections.abc import Mapping

from edge_sim.topology import UnknownColoError


class InFlightCounter:
    """Counts requests in progress per colo against its capacity. Not thread-safe."""

    def __init__(self, capacities: Mapping[str, int]):
        self._capacity = dict(capacities)
        self._in_flight = dict.fromkeys(self._capacity, 0)
        self._full: set[str] = set()

    @property
    def full(self) -> frozenset[str]:
        """Colos at capacity right now."""
        return frozenset(self._full)

    def in_flight(self, colo_id: str) -> int:
        return self._in_flight[self._known(colo_id)]

    def has_room(self, colo_id: str) -> bool:
        return self._known(colo_id) not in self._full

    def try_acquire(self, colo_id: str) -> bool:
        if not self.has_room(colo_id):
            return False
        count = self._in_flight[colo_id] + 1
        self._in_flight[colo_id] = count
        if count >= self._capacity[colo_id]:
            self._full.add(colo_id)
        return True

    def release(self, colo_id: str) -> None:
        count = self._in_flight[self._known(colo_id)]
        if count == 0:
            raise RuntimeError(f"release of colo {colo_id!r} without a matching acquire")
        self._in_flight[colo_id] = count - 1
        self._full.discard(colo_id)

    def _known(self, colo_id: str) -> str:
        if colo_id not in self._capacity:
            raise UnknownColoError(colo_id)
        return colo_id
