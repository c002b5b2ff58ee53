"""`EdgeNetwork`: the one object a router holds. It owns topology, latency, health, faults and
in-flight counters, and answers "where should this request go" and "how did it go"."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_sim.capacity import InFlightCounter
from edge_sim.clock import Clock
from edge_sim.config import EdgeConfig
from edge_sim.faults import ColoFault, FaultBook, ScheduledFault
from edge_sim.geo import ClientLocation, ClientLocator, CountryCentroids, GeoIPReader, open_geoip
from edge_sim.health import OutlierDetector
from edge_sim.routing import ColdStartMs, ColoRanker, IsWarm, RouteCandidate
from edge_sim.topology import Topology


@dataclass(frozen=True, slots=True)
class RoutePlan:
    model: str
    client: ClientLocation
    candidates: tuple[RouteCandidate, ...]  # failover order, never empty


class EdgeNetwork:
    """Simulated edge network state for one router. Not thread-safe: one event loop owns it.

    Per request:  plan = net.route(...); for each candidate: if net.try_acquire(id): wait
    net.delay_s(candidate), fail if net.should_fail(id), call the model, net.release(id, ok).
    """

    def __init__(
        self,
        config: EdgeConfig,
        *,
        clock: Clock = time.monotonic,
        geoip: GeoIPReader | None = None,
        centroids: CountryCentroids | None = None,
    ):
        self._config = config
        self._clock = clock
        self._topology = config.resolved_topology
        ids = self._topology.ids
        if geoip is None and config.geoip_db is not None:
            geoip = open_geoip(config.geoip_db)
        self._locator = ClientLocator(
            config.default_location.location(),
            centroids if centroids is not None else CountryCentroids.from_countryinfo(),
            geoip,
        )
        self._ranker = ColoRanker(self._topology, config.latency, config.routing)
        self._regions = config.region_map()
        self._health = OutlierDetector(ids, config.health, clock)
        self._slots = InFlightCounter({colo.id: colo.capacity for colo in self._topology.colos})
        # Separate streams, so turning jitter on does not change which requests fail.
        self._jitter_rng = random.Random(f"{config.seed}:jitter")
        self._faults = FaultBook(ids, clock, random.Random(f"{config.seed}:faults"))
        for colo_id, faults in sorted(config.faults.items()):
            for fault in faults:
                self._faults.add(colo_id, fault)

    @property
    def config(self) -> EdgeConfig:
        return self._config

    @property
    def topology(self) -> Topology:
        return self._topology

    def route(
        self,
        model: str,
        headers: Mapping[str, str],
        client_ip: str | None = None,
        *,
        is_warm: IsWarm | None = None,
        cold_start_ms: ColdStartMs | None = None,
    ) -> RoutePlan:
        """Rank colos for this request. Raises BadHeaderError (400), NoColoAvailableError (503)."""
        client = self._locator.locate(headers, client_ip)
        unavailable = self._health.unroutable()
        added_latency_ms = {}
        for colo_id, effect in self._faults.active_effects().items():
            if effect.down:
                unavailable.append(colo_id)
            if effect.added_latency_ms:
                added_latency_ms[colo_id] = effect.added_latency_ms
        candidates = self._ranker.rank(
            model,
            client,
            unavailable=unavailable,
            full=self._slots.full,
            added_latency_ms=added_latency_ms,
            is_warm=is_warm,
            cold_start_ms=cold_start_ms,
        )
        return RoutePlan(model, client, tuple(candidates))

    def try_acquire(self, colo_id: str) -> bool:
        """Take a request slot (and, if half-open, a probe slot); False: try the next candidate."""
        if not self._slots.has_room(colo_id):
            return False
        effect = self._faults.effect(colo_id)
        if effect is not None and effect.down:
            return False  # went down since the plan was made
        if not self._health.admit(colo_id):
            return False
        return self._slots.try_acquire(colo_id)

    def release(self, colo_id: str, ok: bool | None) -> None:
        """End an acquired request: ok=True/False feeds outlier detection, None (cancelled) not."""
        self._slots.release(colo_id)
        if ok is None:
            self._health.cancel(colo_id)
        else:
            self._health.record(colo_id, ok)

    def should_fail(self, colo_id: str) -> bool:
        """Does this request fail by an injected error rate at the colo? (seeded draw)"""
        return self._faults.should_fail(colo_id)

    def delay_s(self, candidate: RouteCandidate) -> float:
        """Real seconds to wait to act out the candidate's RTT (jitter and scale applied)."""
        return self.delay_for_rtt_s(candidate.rtt_ms)

    def delay_for_rtt_s(self, rtt_ms: float) -> float:
        """Real seconds to wait to act out a simulated RTT (jitter and scale applied)."""
        latency = self._config.latency
        return latency.real_delay_s(latency.jittered_rtt_ms(rtt_ms, self._jitter_rng))

    def set_fault(self, colo_id: str, fault: ColoFault) -> ScheduledFault:
        """Replace the colo's faults (admin API). Raises UnknownColoError."""
        return self._faults.set(colo_id, fault)

    def add_fault(self, colo_id: str, fault: ColoFault) -> ScheduledFault:
        return self._faults.add(colo_id, fault)

    def clear_faults(self, colo_id: str) -> None:
        self._faults.clear(colo_id)

    def colo_states(self) -> list[dict[str, Any]]:
        """One JSON-ready dict per colo, in topology order, for the admin API."""
        now = self._clock()
        states = []
        for colo in self._topology.colos:
            health = self._health.snapshot(colo.id)
            effect = self._faults.effect(colo.id)
            down = effect is not None and effect.down
            states.append(
                {
                    "id": colo.id,
                    "city": colo.city,
                    "country": colo.country,
                    "region": self._regions.home(colo.id),
                    "lat": colo.lat,
                    "lon": colo.lon,
                    "models": colo.models,
                    "status": colo.status,
                    "capacity": colo.capacity,
                    "in_flight": self._slots.in_flight(colo.id),
                    "healthy": colo.status == "active"
                    and not down
                    and health["state"] == "healthy",
                    "state": health["state"],
                    "health": health,
                    "faults": [s.describe(now) for s in self._faults.scheduled(colo.id)],
                }
            )
        return states
