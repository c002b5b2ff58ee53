"""Where simulated clients are: named regions with a position and a share of the traffic."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClientRegion:
    name: str
    city: str
    lat: float
    lon: float
    weight: float  # relative share of requests in the geo-mix and diurnal scenarios

    @property
    def geo_header(self) -> str:
        """The `x-client-geo` value the router reads."""
        return f"{self.lat:.4f},{self.lon:.4f}"


# Rough shares of a global API's traffic, weighted towards where the Chinese chat models' users
# are; every inhabited continent appears so each part of the colo map gets some requests.
DEFAULT_REGIONS: tuple[ClientRegion, ...] = (
    ClientRegion("na-east", "New York", 40.7128, -74.0060, 0.16),
    ClientRegion("na-west", "San Francisco", 37.7749, -122.4194, 0.10),
    ClientRegion("sa-east", "Sao Paulo", -23.5505, -46.6333, 0.06),
    ClientRegion("eu-west", "London", 51.5074, -0.1278, 0.12),
    ClientRegion("eu-central", "Frankfurt", 50.1109, 8.6821, 0.10),
    ClientRegion("asia-east", "Shanghai", 31.2304, 121.4737, 0.14),
    ClientRegion("asia-northeast", "Tokyo", 35.6762, 139.6503, 0.08),
    ClientRegion("asia-south", "Mumbai", 19.0760, 72.8777, 0.08),
    ClientRegion("asia-southeast", "Singapore", 1.3521, 103.8198, 0.06),
    ClientRegion("oceania", "Sydney", -33.8688, 151.2093, 0.04),
    ClientRegion("africa-west", "Lagos", 6.5244, 3.3792, 0.03),
    ClientRegion("africa-south", "Johannesburg", -26.2041, 28.0473, 0.03),
)

DEFAULT_REGION = "eu-central"
"""Where every client is in the single-region scenarios (steady, ramp, burst, outage)."""


def region_named(name: str, regions: tuple[ClientRegion, ...] = DEFAULT_REGIONS) -> ClientRegion:
    for region in regions:
        if region.name == name:
            return region
    known = ", ".join(region.name for region in regions)
    raise ValueError(f"unknown client region {name!r}; known: {known}")


# The region each of these clients is served from when every region of the shipped
# serve_config.yaml (eu, us, ap) is warm: probes for the region tests and benchmark.
_NEAREST_SHIPPED_REGION = {
    "asia-northeast": "ap",
    "oceania": "ap",
    "eu-central": "eu",
    "eu-west": "eu",
    "na-east": "us",
    "sa-east": "us",
}
CITY_PROBES: dict[str, tuple[str, str]] = {
    region.city.lower().replace(" ", "_"): (region.geo_header, _NEAREST_SHIPPED_REGION[region.name])
    for region in DEFAULT_REGIONS
    if region.name in _NEAREST_SHIPPED_REGION
}
"""City ("tokyo", "frankfurt", ...) -> (its `x-client-geo`, the shipped region nearest to it)."""
