"""Rank colos for one request: an ordered failover list, nearest by simulated RTT first.

Per-colo geometry is precomputed as unit vectors, so a decision over hundreds of colos is a few
numpy operations; only the colos that are drilled down or slowed are passed per request. Warmth,
back-pressure and health are not colo matters: they are the regions' (edge_sim/regions.py), read
from the real replica pools behind them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from edge_sim.geo import EARTH_RADIUS_KM, ClientLocation
from edge_sim.latency import LatencyModel
from edge_sim.topology import ALL_MODELS, Topology

RouteReason = Literal["nearest", "warm", "spillover", "failover"]
"""Why a region was chosen (edge_sim/regions.py): nearest, a detour to a warm one, past a full
one, or past an ejected one / after a failure."""

ColdStartMs = Callable[[str], float]  # model -> measured cold-start time
RANKINGS_KEPT = 4096  # per ranker: the client positions most recently ranked


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_candidates: int = Field(default=4, ge=1, description="length of the failover list")
    max_extra_rtt_ms: float | None = Field(
        default=None,
        ge=0.0,
        description="extra RTT worth paying to reach a warm region instead of the nearest cold "
        "one; None: anything below the model's measured cold-start time",
    )


@dataclass(frozen=True, slots=True)
class RouteCandidate:
    colo_id: str
    rtt_ms: float  # simulated, including latency added by faults
    distance_km: float


class NoColoAvailableError(RuntimeError):
    """No colo can take this model now (router answers 503)."""

    def __init__(self, model: str, message: str):
        super().__init__(message)
        self.model = model
        self.message = message


class ColoRanker:
    """Orders the colos of one topology for (model, client). Immutable after construction."""

    def __init__(self, topology: Topology, latency: LatencyModel, config: RoutingConfig):
        colos = topology.colos
        self._config = config
        self._ids = [colo.id for colo in colos]
        self._index = {colo_id: position for position, colo_id in enumerate(self._ids)}
        lat = np.radians([colo.lat for colo in colos])
        lon = np.radians([colo.lon for colo in colos])
        self._units = np.stack(
            [np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=1
        )
        self._base_rtt_ms = latency.base_rtt_ms
        self._rtt_ms_per_km = latency.rtt_ms_per_km
        # Rankings kept per (model, client position, drills): a router's clients come from few
        # places (all at the default location without geo headers), and each ranking is ~50 us
        # of numpy on the request path. A drill changes the key, never a kept ranking.
        self._ranked = functools.lru_cache(maxsize=RANKINGS_KEPT)(self._rank)
        active = np.array([colo.status == "active" for colo in colos])
        serves_all = np.array([colo.models == ALL_MODELS for colo in colos])
        self._serves_unlisted_model = active & serves_all
        named = sorted({m for colo in colos if colo.models != ALL_MODELS for m in colo.models})
        self._serves = {
            model: active & (serves_all | np.array([model in colo.models for colo in colos]))
            for model in named
        }

    @property
    def colo_ids(self) -> list[str]:
        return list(self._ids)

    def rank(
        self,
        model: str,
        client: ClientLocation,
        *,
        unavailable: Collection[str] = (),
        added_latency_ms: Mapping[str, float] | None = None,
    ) -> list[RouteCandidate]:
        """Entry colos for `model` from `client`, nearest by RTT first, at most max_candidates.

        unavailable: colos no request may enter (drilled down).
        added_latency_ms: extra RTT per colo (a latency drill), which can reorder them.
        """
        added = tuple(sorted(added_latency_ms.items())) if added_latency_ms else ()
        return list(self._ranked(model, client.lat, client.lon, tuple(unavailable), added))

    def _rank(
        self,
        model: str,
        lat: float,
        lon: float,
        unavailable: tuple[str, ...],
        added_latency_ms: tuple[tuple[str, float], ...],
    ) -> tuple[RouteCandidate, ...]:
        """`rank`'s answer, from its hashable arguments (the key of its cache)."""
        index = self._index
        serving = self._serves.get(model, self._serves_unlisted_model)
        usable = serving
        if unavailable:
            usable = serving.copy()
            for colo_id in unavailable:
                position = index.get(colo_id)
                if position is not None:
                    usable[position] = False
        count = int(np.count_nonzero(usable))
        if count == 0:
            raise self._no_colo_error(model, serving)

        rtt, km = self._rtt_and_km(lat, lon)
        for colo_id, extra_ms in added_latency_ms:
            position = index.get(colo_id)
            if position is not None:
                rtt[position] += extra_ms
        sort_key = np.where(usable, rtt, np.inf)
        # Stable sort: equal RTTs keep topology order, so decisions are reproducible.
        order = np.argsort(sort_key, kind="stable")
        # Only the head becomes Python ints (converting all of a 300-colo order costs ~3 us).
        chosen: list[int] = order[: min(self._config.max_candidates, count)].tolist()
        ids = self._ids
        return tuple(RouteCandidate(ids[p], float(rtt[p]), float(km[p])) for p in chosen)

    def _rtt_and_km(self, lat_deg: float, lon_deg: float) -> tuple[np.ndarray, np.ndarray]:
        lat, lon = math.radians(lat_deg), math.radians(lon_deg)
        cos_lat = math.cos(lat)
        client_unit = np.array([cos_lat * math.cos(lon), cos_lat * math.sin(lon), math.sin(lat)])
        cosines = self._units @ client_unit
        # Rounding can push a cosine a hair past +-1, where arccos is undefined.
        np.minimum(cosines, 1.0, out=cosines)
        np.maximum(cosines, -1.0, out=cosines)
        km = np.arccos(cosines)
        km *= EARTH_RADIUS_KM
        rtt = km * self._rtt_ms_per_km
        rtt += self._base_rtt_ms
        return rtt, km

    def _no_colo_error(self, model: str, serving: np.ndarray) -> NoColoAvailableError:
        serving_count = int(np.count_nonzero(serving))
        if serving_count == 0:
            return NoColoAvailableError(model, f"no active colo serves model {model!r}")
        return NoColoAvailableError(
            model,
            f"no colo can take model {model!r} now: all {serving_count} colos serving it are down",
        )
