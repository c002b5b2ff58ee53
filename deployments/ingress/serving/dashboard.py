"""The live dashboard's service: everything GET /admin/dashboard-data answers, from the drills'
colo states, Serve's replica counts (or real regions when a source of them is given) and the
recent traffic of every router replica, shared through edge-control."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from deployments.contracts.edge_control_deployment import EdgeControlClient
from deployments.ingress.dashboard.data import dashboard_data
from deployments.ingress.serving.drills import FaultDrills
from deployments.ingress.serving.models import DeploymentStates
from deployments.observability.recent_traffic import RecentTraffic

log = logging.getLogger("ray.serve")
PUBLISH_INTERVAL_S = 1.0  # the page polls every second: a replica's traffic is at most 1 s old
# With nothing new, a publish this often still says the replica is there (edge-control forgets a
# replica silent for 10 s) and lets its window's old minutes age out on the page.
IDLE_PUBLISH_INTERVAL_S = 4.0
# Real regions, when the router has them: the /admin/regions payload (a list of regions).
RegionsSource = Callable[[], Awaitable[Sequence[Mapping[str, Any]]]]


def this_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class TrafficShare:
    """This router replica's recent traffic, published to edge-control so that whichever replica
    answers the page shows the sum of all of them. Without edge-control (tests): this one only."""

    def __init__(
        self,
        recent: RecentTraffic,
        control: EdgeControlClient | None = None,
        replica_id: str | None = None,
    ):
        self.recent = recent
        self._control = control  # the edge-control deployment's client
        self._replica_id = replica_id or this_replica_id()

    async def publish(self) -> None:
        if self._control is not None:
            await self._control.report_traffic(self._replica_id, self.recent.snapshot())

    async def publish_forever(self) -> None:
        """Publish each second while requests come, every IDLE_PUBLISH_INTERVAL_S otherwise."""
        if self._control is None:
            return
        published, published_at = -1, float("-inf")
        while True:
            recorded = self.recent.recorded
            if recorded != published or time.monotonic() - published_at >= IDLE_PUBLISH_INTERVAL_S:
                try:
                    await self.publish()
                    published, published_at = recorded, time.monotonic()
                except Exception:  # noqa: BLE001 - the next publish retries; serving goes on
                    log.warning("traffic publish to edge-control failed", exc_info=True)
            await asyncio.sleep(PUBLISH_INTERVAL_S)

    async def snapshots(self) -> list[dict[str, Any]]:
        """Every replica's latest snapshot, this one's fresh."""
        mine = self.recent.snapshot()
        if self._control is None:
            return [mine]
        others = await self._control.traffic()
        return [mine, *(s for replica, s in others.items() if replica != self._replica_id)]


class DashboardService:
    def __init__(
        self,
        drills: FaultDrills,
        models: Sequence[str],
        deployment_states: DeploymentStates,
        traffic: TrafficShare,
        last_cold_start: Mapping[str, Any],
        regions: RegionsSource | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.drills = drills
        self.models = list(models)
        self.deployment_states = deployment_states
        self.traffic = traffic
        self.last_cold_start = last_cold_start
        self.regions = regions
        self._clock = clock

    async def data(self) -> dict[str, Any]:
        colos, states, snapshots = await asyncio.gather(
            self.drills.colos(), self.deployment_states(), self.traffic.snapshots()
        )
        regions = await self.regions() if self.regions is not None else None
        return dashboard_data(
            now=self._clock(),
            colos=colos,
            models=self.models,
            replica_states={
                name: state.replica_states or {"RUNNING": state.running_replicas}
                for name, state in states.items()
            },
            traffic_snapshots=snapshots,
            regions=regions,
            last_cold_start=self.last_cold_start,
        )
