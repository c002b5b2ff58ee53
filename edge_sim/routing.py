"""Rank colos for one request: an ordered failover list, nearest by simulated RTT first.

Per-colo geometry is precomputed as unit vectors, so a decision over hundreds of colos is a few
numpy operations; only the colos that are down, ejected, full or slowed are passed per request.
"""

from __future__ import annotations

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
"""Why a colo was chosen. The ranking gives the first candidate "nearest", "warm" or "spillover"
and the rest "nearest"; the router marks "failover" when it moves down the list after a failure."""

IsWarm = Callable[[str, str], bool]  # (colo_id, model) -> has a loaded replica
ColdStartMs = Callable[[str], float]  # model -> measured cold-start time


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_candidates: int = Field(default=4, ge=1, description="length of the failover list")
    max_extra_rtt_ms: float | None = Field(
        default=None,
        ge=0.0,
        description="extra RTT worth paying to reach a warm colo instead of the nearest cold one; "
        "None: anything below the model's measured cold-start time",
    )


@dataclass(frozen=True, slots=True)
class RouteCandidate:
    colo_id: str
    rtt_ms: float  # simulated, including latency added by faults
    distance_km: float
    reason: RouteReason


class NoColoAvailableError(RuntimeError):
    """No colo can take this model now (router answers 503)."""

    def __init__(self, model: str, message: str):
        super().__init__(message)
        self.model = model
        self.message = message


# Sorts full colos behind every colo with room while keeping their own RTT order.
_FULL_PENALTY_MS = 1e12


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
        full: Collection[str] = (),
        added_latency_ms: Mapping[str, float] | None = None,
        is_warm: IsWarm | None = None,
        cold_start_ms: ColdStartMs | None = None,
    ) -> list[RouteCandidate]:
        """Failover list for `model` from `client`, best first, at most max_candidates long.

        unavailable: colos no request may go to (down, ejected, half-open with no probe slot).
        full: colos at capacity; they stay in the list, behind every colo with room.
        is_warm / cold_start_ms: when the nearest colo is cold, a warm one first if the extra RTT
        is within max_extra_rtt_ms (default: below the model's cold-start time).
        """
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

        rtt, km = self._rtt_and_km(client)
        if added_latency_ms:
            for colo_id, extra_ms in added_latency_ms.items():
                position = index.get(colo_id)
                if position is not None:
                    rtt[position] += extra_ms
        sort_key = np.where(usable, rtt, np.inf)
        full_positions = [index[c] for c in full if c in index and usable[index[c]]]
        for position in full_positions:
            sort_key[position] += _FULL_PENALTY_MS
        # Stable sort: equal RTTs keep topology order, so decisions are reproducible.
        order = np.argsort(sort_key, kind="stable")
        max_candidates = self._config.max_candidates
        # Only the head becomes Python ints (converting all of a 300-colo order costs ~3 us).
        chosen: list[int] = order[: min(max_candidates, count)].tolist()

        first = chosen[0]
        reason: RouteReason = "nearest"
        if full_positions and first not in full_positions:
            nearest_full = min(full_positions, key=lambda position: (rtt[position], position))
            if (rtt[nearest_full], nearest_full) < (rtt[first], first):
                reason = "spillover"
        if (
            is_warm is not None
            and first not in full_positions
            and not is_warm(self._ids[first], model)
        ):
            warm = self._warm_alternative(model, order, sort_key, is_warm, cold_start_ms)
            if warm is not None:
                chosen = [warm, *(p for p in chosen if p != warm)][:max_candidates]
                reason = "warm"

        ids = self._ids
        candidates = [
            RouteCandidate(ids[p], float(rtt[p]), float(km[p]), "nearest") for p in chosen
        ]
        if reason != "nearest":
            head = candidates[0]
            candidates[0] = RouteCandidate(head.colo_id, head.rtt_ms, head.distance_km, reason)
        return candidates

    def _rtt_and_km(self, client: ClientLocation) -> tuple[np.ndarray, np.ndarray]:
        lat, lon = math.radians(client.lat), math.radians(client.lon)
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

    def _warm_alternative(
        self,
        model: str,
        order: np.ndarray,
        sort_key: np.ndarray,
        is_warm: IsWarm,
        cold_start_ms: ColdStartMs | None,
    ) -> int | None:
        """The nearest warm colo with room worth its extra RTT over the (cold) first choice."""
        first_rtt = float(sort_key[order[0]])
        if self._config.max_extra_rtt_ms is not None:
            limit_ms, inclusive = first_rtt + self._config.max_extra_rtt_ms, True
        else:
            # Paying as much extra RTT as the cold start itself would gain nothing.
            budget_ms = cold_start_ms(model) if cold_start_ms is not None else 0.0
            limit_ms, inclusive = first_rtt + budget_ms, False
        # Full colos carry a huge penalty in sort_key; the cap keeps them out of any budget.
        limit_ms = min(limit_ms, _FULL_PENALTY_MS / 2)
        within = sort_key <= limit_ms if inclusive else sort_key < limit_ms
        reachable = int(np.count_nonzero(within))
        ids = self._ids
        for position in order[1:reachable].tolist():
            if is_warm(ids[position], model):
                return int(position)
        return None

    def _no_colo_error(self, model: str, serving: np.ndarray) -> NoColoAvailableError:
        serving_count = int(np.count_nonzero(serving))
        if serving_count == 0:
            return NoColoAvailableError(model, f"no active colo serves model {model!r}")
        return NoColoAvailableError(
            model,
            f"no colo can take model {model!r} now: all {serving_count} colos serving it "
            "are down or ejected",
        )
