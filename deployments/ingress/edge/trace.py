"""Where a request went and why: the x-edge-* response headers and what telemetry records."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_sim.geo import ClientLocation


@dataclass
class EdgeTrace:
    colo: str
    region: str
    rtt_ms: float
    reason: str
    tried: list[str] = field(default_factory=list)  # drilled colos passed, then regions tried
    cold_start_ms: float | None = None
    cache: str | None = None
    client: ClientLocation | None = None
    cold_start_phases: dict[str, float | None] | None = None  # of the replica it waited on
    skipped_colos: tuple[str, ...] = ()  # entry colos whose drill failed the request
    failed_regions: tuple[str, ...] = ()  # regions that failed it (5xx, time-out, lost)

    def headers(self) -> dict[str, str]:
        headers = {
            "x-edge-colo": self.colo,
            "x-edge-region": self.region,
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
