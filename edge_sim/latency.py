"""Simulated round-trip time over fibre: distance -> RTT, optional seeded jitter, real delay."""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field


class LatencyModel(BaseModel):
    """RTT = 2 x (great-circle km x route_inflation / fibre speed + per-hop cost).

    Light in fibre covers ~200,000 km/s; real paths are ~1.5x longer than the great circle; each
    router on the way adds a little, and paths have about one hop every `km_per_hop`. The RTT grows
    strictly with distance, so ranking by RTT is ranking by distance (plus fault-added latency).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    fiber_km_per_s: float = Field(default=200_000.0, gt=0)
    route_inflation: float = Field(default=1.5, ge=1.0)
    per_hop_ms: float = Field(default=0.25, ge=0.0, description="one-way cost of one router hop")
    km_per_hop: float = Field(default=1_000.0, gt=0)
    jitter_ms: float = Field(default=0.0, ge=0.0, description="uniform extra RTT in [0, jitter_ms)")
    real_delay_scale: float = Field(
        default=1.0, ge=0.0, description="fraction of the simulated RTT really slept; 0 disables"
    )

    @property
    def base_rtt_ms(self) -> float:
        """RTT at distance 0: the first hop, both ways."""
        return 2 * self.per_hop_ms

    @property
    def rtt_ms_per_km(self) -> float:
        propagation = self.route_inflation / self.fiber_km_per_s * 1000.0
        return 2 * (propagation + self.per_hop_ms / self.km_per_hop)

    def rtt_ms(self, distance_km: float) -> float:
        return self.base_rtt_ms + distance_km * self.rtt_ms_per_km

    def jittered_rtt_ms(self, rtt_ms: float, rng: random.Random) -> float:
        """`rtt_ms` plus jitter drawn from `rng` (no draw at all when jitter is off)."""
        if self.jitter_ms == 0:
            return rtt_ms
        return rtt_ms + rng.uniform(0.0, self.jitter_ms)

    def real_delay_s(self, rtt_ms: float) -> float:
        """How long the router should really wait to act out `rtt_ms` of network time."""
        return rtt_ms * self.real_delay_scale / 1000.0
