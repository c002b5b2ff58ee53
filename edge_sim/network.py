"""`EdgeNetwork`: the simulated part of the edge a router holds: topology, client location,
latency and the colo drills. It answers "which colos would this client enter by" and "how long
does that take". What is real (warm, full, failing) lives with the regions' replica pools."""

from __future__ import annotations

import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_sim.clock import Clock
from edge_sim.config import EdgeConfig
from edge_sim.faults import ColoFault, FaultBook, ScheduledFault
from edge_sim.geo import ClientLocation, ClientLocator, CountryCentroids, GeoIPReader, open_geoip
from edge_sim.routing import ColoRanker, RouteCandidate
from edge_sim.topology import Topology


@dataclass(frozen=True, slots=True)
class RoutePlan:
    model: str
    client: ClientLocation
    candidates: tuple[RouteCandidate, ...]  # entry colos, nearest first, never empty


class EdgeNetwork:
    """Simulated edge network state for one router. Not thread-safe: one event loop owns it.

    Per request: plan = net.route(...); the first candidate whose drill does not fail the request
    (net.should_fail) is the entry colo; net.delay_s(candidate) is its RTT to act out.
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
    ) -> RoutePlan:
        """Rank colos for this request. Raises BadHeaderError (400), NoColoAvailableError (503)."""
        client = self._locator.locate(headers, client_ip)
        unavailable = []
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
            added_latency_ms=added_latency_ms,
        )
        return RoutePlan(model, client, tuple(candidates))

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
        """One JSON-ready dict per colo, in topology order, for the admin API. A colo is up
        unless a drill takes it down (or it is not active): the state of the replicas behind
        it is its region's, in /admin/regions."""
        now = self._clock()
        states = []
        for colo in self._topology.colos:
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
                    "healthy": colo.status == "active" and not down,
                    "faults": [s.describe(now) for s in self._faults.scheduled(colo.id)],
                }
            )
        return states
