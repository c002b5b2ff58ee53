"""The planner's world: the router's own edge config (colos, regions, latency, routing) and the
places clients send from. `synthetic_world` grows the shipped colos to any size for scale runs."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from edge_sim.config import EdgeConfig
from edge_sim.geo import haversine_km
from edge_sim.regions import RegionMap
from edge_sim.routing import ColoRanker
from edge_sim.topology import Topology


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a share of the clients are: a point, its UTC offset (for local time of day) and a
    relative weight of the traffic."""

    name: str
    lat: float
    lon: float
    weight: float = 1.0

    @property
    def utc_offset_h(self) -> float:
        """Solar time: 15 degrees of longitude per hour (good enough for a daily curve)."""
        return self.lon / 15.0


class World:
    """The edge config the router would run with, and the clients' origins. Immutable."""

    def __init__(self, edge: EdgeConfig, origins: Sequence[Origin]):
        if not origins:
            raise ValueError("a world needs at least one client origin")
        self.edge = edge
        self.origins = tuple(origins)
        self.topology: Topology = edge.resolved_topology
        self.regions: RegionMap = edge.region_map()
        self.ranker = ColoRanker(self.topology, edge.latency, edge.routing)

    @property
    def region_names(self) -> tuple[str, ...]:
        return self.regions.names

    def region_position(self, region: str) -> tuple[float, float]:
        """(lat, lon) of a region, for its local time of day (a config without regions:
        the mean of the colos)."""
        if self.edge.regions and region in self.edge.regions:
            spec = self.edge.regions[region]
            return spec.lat, spec.lon
        colos = self.topology.colos
        return sum(c.lat for c in colos) / len(colos), sum(c.lon for c in colos) / len(colos)

    @classmethod
    def with_colo_origins(cls, edge: EdgeConfig, seed: int = 0) -> World:
        """One origin at each colo, weighted by a seeded log-normal draw (cities differ)."""
        rng = random.Random(f"{seed}:origins")
        origins = [
            Origin(colo.id, colo.lat, colo.lon, rng.lognormvariate(0.0, 0.8))
            for colo in edge.resolved_topology.colos
        ]
        return cls(edge, origins)


def synthetic_world(
    n_colos: int = 300,
    n_regions: int = 20,
    *,
    seed: int = 0,
    base: EdgeConfig | None = None,
) -> World:
    """The shipped colos plus seeded satellites around them (within ~600 km) up to `n_colos`, and
    `n_regions` regions at colos spread by farthest-point sampling; one client origin per colo.
    Latency, routing and region policy come from `base` (default: the defaults)."""
    base = base or EdgeConfig()
    shipped = Topology.default().colos
    if n_colos < len(shipped):
        colos = [c.model_dump() for c in shipped[:n_colos]]
    else:
        rng = random.Random(f"{seed}:colos")
        colos = [c.model_dump() for c in shipped]
        taken = {c.id for c in shipped}
        ids = (_colo_id(i) for i in range(26**3))
        while len(colos) < n_colos:
            parent = shipped[len(colos) % len(shipped)]
            colo_id = next(i for i in ids if i not in taken)
            taken.add(colo_id)
            colos.append(
                {
                    "id": colo_id,
                    "city": f"near {parent.city}",
                    "country": parent.country,
                    "lat": max(-89.0, min(89.0, parent.lat + rng.uniform(-5, 5))),
                    "lon": ((parent.lon + rng.uniform(-5, 5) + 180.0) % 360.0) - 180.0,
                }
            )
    if not 1 <= n_regions <= len(colos):
        raise ValueError(f"n_regions must be between 1 and the number of colos ({len(colos)})")
    # Farthest-point sampling from the first shipped colo: regions spread over the map.
    chosen = [0]
    nearest = [haversine_km(c["lat"], c["lon"], colos[0]["lat"], colos[0]["lon"]) for c in colos]
    while len(chosen) < n_regions:
        far = max(range(len(colos)), key=lambda i: nearest[i])
        chosen.append(far)
        for i, c in enumerate(colos):
            d = haversine_km(c["lat"], c["lon"], colos[far]["lat"], colos[far]["lon"])
            nearest[i] = min(nearest[i], d)
    regions = {
        str(colos[i]["id"]).lower(): {"lat": colos[i]["lat"], "lon": colos[i]["lon"]}
        for i in chosen
    }
    edge = EdgeConfig.model_validate(
        {
            **base.model_dump(exclude={"topology", "regions", "faults"}),
            "topology": {"colos": colos},
            "regions": regions,
        }
    )
    return World.with_colo_origins(edge, seed)


def _colo_id(i: int) -> str:
    return "".join(chr(65 + (i // 26**k) % 26) for k in range(3))
