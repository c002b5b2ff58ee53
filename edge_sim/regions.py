"""Regions: real replica pools (one Serve deployment per model and region) behind the simulated
colos. Each colo belongs to one region; a request enters at its nearest colo and is served by a
region chosen here, as a pure function of a snapshot of the pools' real state.

The decision, for one model (`plan_regions`):
- every region warm and with room -> the entry colo's own region (`nearest`);
- that region at zero replicas and a warm one reachable for less extra RTT than the model's cold
  start -> the warm one (`warm`), and the cold one is woken, so later requests stay near;
- everything cold -> the nearest region anyway: the request itself makes Serve scale it up;
- a region that answered with back-pressure lately is tried after every region with room
  (`spillover`); an ejected one (real failures) is skipped (`failover`) unless nothing else is left.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from edge_sim.geo import haversine_km
from edge_sim.health import OutlierDetectionConfig
from edge_sim.latency import LatencyModel
from edge_sim.routing import RouteReason
from edge_sim.topology import Topology
from edge_sim.validation import Latitude, Longitude

REGION_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")
SINGLE_REGION = "default"
"""The one region of a config without `regions`: one deployment per model, named after it."""

Placement = Literal["auto", "node_resource", "shared"]


class Region(BaseModel):
    """One GPU datacentre: where it is, and (optionally) which colos it serves."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lat: Latitude
    lon: Longitude
    colos: list[str] | None = Field(
        default=None, description="colo ids served from here; unlisted colos go to the nearest"
    )


def _regions_health() -> OutlierDetectionConfig:
    # Few regions: eject after a short run of real failures, for a short while, and at most 10%
    # of them (with three regions: one), never the last healthy one.
    return OutlierDetectionConfig(
        consecutive_failures=3, base_ejection_s=10.0, max_ejection_s=60.0, max_ejection_percent=10
    )


class RegionPolicy(BaseModel):
    """How requests pick a region; applies to configs with or without `regions`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    placement: Placement = Field(
        default="auto",
        description="node_resource: a region's replicas need its `region:<name>` node resource; "
        "shared: regions share whatever node has room; auto: node_resource when any node of the "
        "cluster has a region resource when the app is built",
    )
    ingress_resource: str | None = Field(
        default=None,
        min_length=1,
        description="a node resource the router and edge-control need (give it to the head, e.g. "
        "`ray start --head --resources '{\"ingress\": 1}'`), so losing a region's node never "
        "takes the ingress with it; None: they go wherever there is room",
    )
    backhaul: bool = Field(
        default=True, description="act out the colo->region RTT (geography) besides client->colo"
    )
    health: OutlierDetectionConfig = Field(default_factory=_regions_health)
    saturation_hold_s: float = Field(
        default=1.0, gt=0, le=60, description="how long a back-pressure answer makes a pool 'full'"
    )
    wake_timeout_s: float = Field(
        default=120.0, gt=0, le=3600, description="how long a wake request waits for a replica"
    )


def validate_regions(regions: Mapping[str, Region], topology: Topology) -> None:
    """Names usable in deployment and resource names; colos known and in one region at most."""
    if not regions:
        raise ValueError("regions: declare at least one region, or leave `regions` out")
    known = set(topology.ids)
    owner: dict[str, str] = {}
    for name, region in regions.items():
        if not REGION_NAME.match(name):
            raise ValueError(
                f"regions: name {name!r} must be 1-16 lower-case letters or digits, "
                "starting with a letter (it ends deployment names: glm-<region>)"
            )
        for colo_id in region.colos or []:
            if colo_id not in known:
                raise ValueError(f"regions.{name}.colos: unknown colo {colo_id!r}")
            if colo_id in owner:
                raise ValueError(
                    f"regions.{name}.colos: colo {colo_id!r} is already in region "
                    f"{owner[colo_id]!r}"
                )
            owner[colo_id] = name


class RegionMap:
    """Which region each colo belongs to, and the backhaul RTT from a colo to every region.
    Immutable; a config without regions maps every colo to SINGLE_REGION at no extra RTT."""

    def __init__(
        self,
        topology: Topology,
        regions: Mapping[str, Region] | None,
        latency: LatencyModel,
        backhaul: bool = True,
    ):
        self.names: tuple[str, ...] = tuple(regions) if regions else (SINGLE_REGION,)
        self._order: dict[str, tuple[tuple[str, float], ...]] = {}
        self._home: dict[str, str] = {}
        for colo in topology.colos:
            if not regions:
                self._home[colo.id] = SINGLE_REGION
                self._order[colo.id] = ((SINGLE_REGION, 0.0),)
                continue
            rtt = {
                name: latency.rtt_ms(haversine_km(colo.lat, colo.lon, r.lat, r.lon))
                if backhaul
                else 0.0
                for name, r in regions.items()
            }
            listed = [name for name, r in regions.items() if r.colos and colo.id in r.colos]
            # Unlisted colos belong to the geographically nearest region (ties: config order).
            home = (
                listed[0]
                if listed
                else min(
                    regions, key=lambda name: haversine_km(colo.lat, colo.lon, *_at(regions[name]))
                )
            )
            self._home[colo.id] = home
            others = sorted((name for name in regions if name != home), key=lambda n: rtt[n])
            self._order[colo.id] = tuple((name, rtt[name]) for name in (home, *others))

    def home(self, colo_id: str) -> str:
        return self._home[colo_id]

    def from_colo(self, colo_id: str) -> tuple[tuple[str, float], ...]:
        """(region, backhaul RTT ms) from this colo, its own region first, then by RTT."""
        return self._order[colo_id]

    def colos_of(self, region: str) -> list[str]:
        return [colo_id for colo_id, home in self._home.items() if home == region]


def _at(region: Region) -> tuple[float, float]:
    return region.lat, region.lon


@dataclass(frozen=True, slots=True)
class PoolView:
    """What every router knows of one region's replica pool for one model (a snapshot)."""

    running: int = 0  # RUNNING replicas, as Serve's controller reports them
    ejected: bool = False  # outlier detection saw real failures there
    saturated: bool = False  # answered with back-pressure (queue full) moments ago

    @property
    def warm(self) -> bool:
        return self.running > 0


@dataclass(frozen=True, slots=True)
class RegionCandidate:
    region: str
    rtt_ms: float  # client -> colo -> region, simulated
    reason: RouteReason


@dataclass(frozen=True, slots=True)
class RegionPlan:
    """Regions to try in order (never empty), and the cold region to wake, if any."""

    candidates: tuple[RegionCandidate, ...]
    wake: str | None = None


def plan_regions(
    reachable: Sequence[tuple[str, float]],
    pools: Mapping[str, PoolView],
    *,
    cold_start_ms: float,
    max_extra_rtt_ms: float | None = None,
    max_candidates: int = 3,
) -> RegionPlan:
    """Order the regions for one request.

    reachable: (region, RTT ms) from the client, nearest (its entry colo's region) first.
    pools: the model's pool per region; a region missing here is cold, healthy and has room.
    cold_start_ms: the model's measured cold start; a warm region is worth up to this much
    extra RTT (or max_extra_rtt_ms when set) over the nearest, cold one.
    """
    if not reachable:
        raise ValueError("no region to route to")
    empty = PoolView()
    view = {name: pools.get(name, empty) for name, _ in reachable}
    routable = [(name, rtt) for name, rtt in reachable if not view[name].ejected]
    # Outlier detection never ejects the last healthy region; if a stale snapshot says
    # otherwise, trying an ejected region beats refusing the request.
    ejected_first = not routable or routable[0][0] != reachable[0][0]
    if not routable:
        routable = list(reachable)
    with_room = [(name, rtt) for name, rtt in routable if not view[name].saturated]
    full = [(name, rtt) for name, rtt in routable if view[name].saturated]
    order = with_room + full  # back-pressure sends a region behind every one with room
    head, head_rtt = order[0]
    reason: RouteReason = "failover" if ejected_first else "nearest"
    if with_room and head != routable[0][0] and not ejected_first:
        reason = "spillover"
    wake = None
    if with_room and not view[head].warm:
        budget_ms = cold_start_ms if max_extra_rtt_ms is None else max_extra_rtt_ms
        for name, rtt in with_room[1:]:
            extra_ms = rtt - head_rtt
            within = extra_ms <= budget_ms if max_extra_rtt_ms is not None else extra_ms < budget_ms
            if not within:
                break  # sorted by RTT: the rest are further still
            if view[name].warm:
                wake, reason = head, "warm"
                order = [(name, rtt), *(entry for entry in order if entry[0] != name)]
                break
    candidates = tuple(
        RegionCandidate(name, rtt, reason if position == 0 else "nearest")
        for position, (name, rtt) in enumerate(order[:max_candidates])
    )
    return RegionPlan(candidates, wake)


# The routers' Serve deployment: edge-control counts its running replicas, so each router's fair
# queue takes its share of a model's slots (deployments.ingress.edge.fair_queue).
ROUTER_DEPLOYMENT = "router"


def deployment_name(model: str, region: str) -> str:
    """The Serve deployment of a model in a region (`glm-eu`); the model's own name without
    regions, so a config without them keeps today's deployment names."""
    return model if region == SINGLE_REGION else f"{model}-{region}"


def region_resource(region: str) -> str:
    """The custom node resource that marks a node as the region's (`ray start --resources`)."""
    return f"region:{region}"
