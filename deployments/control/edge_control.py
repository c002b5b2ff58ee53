"""`edge-control`: the one place every router replica and model replica share edge state with.

- Routers call `sync(outcomes)` twice a second while they serve, less often while idle (every
  4 s at the slowest): they hand over how their requests went (real failures, back-pressure,
  cold starts) and get back one snapshot of every region's pool: RUNNING replicas as Serve
  reports them, health, back-pressure marks, measured cold starts.
  `snapshot()` gives them the colo fault drills.
- `ServeView` reads Serve's replicas per deployment (`deployments.ray_ext.serve_details`) every
  0.5 s while they change or routers report traffic, less often while all is still; a failed read
  keeps the last good view.
- Model replicas long-poll `region_faults(region, version)`: a region drill reaches the replicas
  themselves, which then fail the requests that reach them, so routers see real errors.
- Recent traffic: each router replica publishes its last minutes here, so the dashboard shows all
  of them.
- Pre-warming (`edge.prewarm`, deployments.control.prewarm): routers hand over their demand per
  (model, home region) on each sync; pools the forecast expects busy are held at one replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from deployments.contracts.faults import FaultEntries, describe_fault, fault_window
from deployments.control.prewarm import PredictiveWarmer
from deployments.pacing import PollPacer
from deployments.ray_ext.serve_details import DeploymentReader, DeploymentReplicas
from edge_sim.clock import Clock
from edge_sim.prewarm import PrewarmConfig
from edge_sim.region_board import BoardSnapshot, Outcome, RegionBoard
from edge_sim.regions import ROUTER_DEPLOYMENT, RegionPolicy

SERVE_POLL_INTERVAL_S = 0.5  # while replicas change, start or stop, or routers report traffic
SERVE_IDLE_POLL_INTERVAL_S = 4.0  # the slowest poll, reached by doubling while all is still
FIRST_POLL_TIMEOUT_S = 2.0
ADMIN_READ_TIMEOUT_S = 2.0  # the admin view waits this long for a fresh read of Serve
FAULT_POLL_TIMEOUT_S = 30.0  # a replica's long poll returns at least this often
TRAFFIC_STALE_S = 10.0  # a replica that stopped publishing this long ago is gone

log = logging.getLogger("ray.serve")

Pools = dict[str, dict[str, str]]  # model -> region -> Serve deployment name
PoolCounts = dict[tuple[str, str], int]  # (model, region) -> replicas


class FaultStore:
    """Admin-set faults per id (colo or region) with their wall-clock start, and a version that
    wakes long-polling readers on every change."""

    def __init__(self, wall_clock: Clock = time.time) -> None:
        self.entries: FaultEntries = {}
        self.version = 0
        self._wall_clock = wall_clock
        self._changed = asyncio.Event()

    def set(self, key: str, fault: dict[str, Any]) -> int:
        self.entries[key] = [{"fault": fault, "set_at": self._wall_clock()}]
        return self._bump()

    def clear(self, key: str) -> int:
        self.entries[key] = []  # kept, so readers clear it too
        return self._bump()

    async def changed_since(self, version: int, timeout_s: float) -> None:
        while self.version == version:
            event = self._changed
            try:
                await asyncio.wait_for(event.wait(), timeout_s)
            except TimeoutError:
                return

    def _bump(self) -> int:
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return self.version


def _app_name() -> str:
    from ray import serve

    return serve.get_replica_context().app_name


def _deployment_handle(name: str) -> Any:
    from ray import serve

    return serve.get_deployment_handle(name, _app_name())


class ServeView:
    """Edge-control's copy of Serve's replicas per (model, region), kept on the board.

    One read at a time, in a worker thread (Serve's calls block). A read that fails leaves the
    board as the last good read left it, so a busy or restarting controller never turns into a
    500 nor flips a region warm or cold; `describe()` tells its age and the last error.
    """

    def __init__(
        self,
        pools: Pools,
        board: RegionBoard,
        read: Callable[[], Mapping[str, DeploymentReplicas]],
        clock: Clock = time.monotonic,
        pacer: PollPacer | None = None,
    ) -> None:
        self._pools = pools
        self._board = board
        self._read = read
        self._clock = clock
        self.pacer = pacer or PollPacer(SERVE_POLL_INTERVAL_S, SERVE_IDLE_POLL_INTERVAL_S)
        self.polled = asyncio.Event()  # set by the first good read
        self._reading = asyncio.Lock()
        self._wake = asyncio.Event()
        self._running: PoolCounts | None = None
        self._traffic = False
        self.read_at: float | None = None
        self.failed_reads = 0
        self.error: str | None = None  # the last read's, while reads fail

    async def refresh(self) -> bool:
        """Read Serve now; True when the replicas read differ from the last good read or some
        of the pools' replicas are starting or stopping. Never raises: a failure is logged and
        the last good view stays."""
        async with self._reading:
            try:
                deployments = await asyncio.to_thread(self._read)
            except Exception as exc:  # noqa: BLE001 - any failure to read Serve: keep the view
                self._failed(exc)
                return False
            return self._update(deployments)

    async def run(self) -> None:
        """Read forever, paced by `pacer`; `note_traffic` cuts an idle wait short."""
        while True:
            busy = await self.refresh() or self._traffic
            self._traffic = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.pacer.after_read(busy))
            self._wake.clear()

    def note_traffic(self) -> None:
        """Routers reported requests: read at the fast pace again, from now."""
        self._traffic = True
        if self.pacer.idle:
            self._wake.set()

    def describe(self) -> dict[str, Any]:
        return {
            "age_s": None if self.read_at is None else round(self._clock() - self.read_at, 3),
            "failed_reads": self.failed_reads,
            "error": self.error,
        }

    def _update(self, deployments: Mapping[str, DeploymentReplicas]) -> bool:
        absent = DeploymentReplicas(running=0, target=0, settling=False)  # not (yet) deployed
        pools = {
            (model, region): deployments.get(name, absent)
            for model, by_region in self._pools.items()
            for region, name in by_region.items()
        }
        running = {key: pool.running for key, pool in pools.items()}
        targets = {key: pool.target for key, pool in pools.items()}
        wanted = {k: t for k, t in targets.items() if t is not None}
        changed = self._running is not None and running != self._running
        self._running = running
        # Targets unknown (read by serve.status()): the last ones known stay.
        self._board.set_replicas(running, wanted if len(wanted) == len(targets) else None)
        self._board.set_routers(deployments.get(ROUTER_DEPLOYMENT, absent).running)
        self.read_at = self._clock()
        self.error = None
        self.polled.set()
        return changed or any(pool.settling for pool in pools.values())

    def _failed(self, exc: Exception) -> None:
        self.failed_reads += 1
        first = self.error is None
        self.error = f"{type(exc).__name__}: {exc}"
        # At warning level once per run of failures: the controller may be down a while.
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "edge-control: reading Serve's replicas failed; keeping the last good view",
            exc_info=first,
        )


class EdgeControl:
    """A Ray Serve deployment (one replica). `clock` is monotonic (health, pacing, staleness);
    `wall_clock` is unix time, which every replica shares (fault windows, pre-warming's buckets);
    `read_serve` reads Serve's deployments (blocking; run in a worker thread); `pool_handle`
    gives a deployment's handle by name (pre-warming holds pools through it)."""

    def __init__(
        self,
        pools: Pools | None = None,
        policy: dict[str, Any] | None = None,
        default_cold_start_ms: float = 3000.0,
        clock: Clock = time.monotonic,
        wall_clock: Clock = time.time,
        read_serve: Callable[[], Mapping[str, DeploymentReplicas]] | None = None,
        prewarm: dict[str, Any] | None = None,
        pool_handle: Callable[[str], Any] = _deployment_handle,
    ) -> None:
        self._pools = pools or {}
        regions = sorted({r for by_region in self._pools.values() for r in by_region})
        self._board = RegionBoard(
            list(self._pools),
            regions,
            RegionPolicy.model_validate(policy or {}),
            default_cold_start_ms,
            clock,
        )
        self._clock = clock
        self._wall_clock = wall_clock
        self.serve = ServeView(
            self._pools, self._board, read_serve or DeploymentReader(_app_name), clock
        )
        self._colo_faults = FaultStore(wall_clock)
        self._region_faults = FaultStore(wall_clock)
        self._poller: asyncio.Task[None] | None = None
        prewarm_config = PrewarmConfig.model_validate(prewarm or {})
        self.warmer: PredictiveWarmer | None = None
        if prewarm_config.enabled:
            self.warmer = PredictiveWarmer(
                prewarm_config,
                list(self._pools),
                regions,
                lambda model, region: pool_handle(self._pools[model][region]),
                wall_clock,
            )
        self._warming: asyncio.Task[None] | None = None
        self._traffic: dict[str, tuple[float, dict[str, Any]]] = {}

    # ---- routers ------------------------------------------------------------------------------

    async def sync(
        self, outcomes: list[Outcome], demand: Mapping[tuple[str, str], int] | None = None
    ) -> BoardSnapshot:
        """Take a router's outcomes and demand (requests per (model, home region)) since its
        last sync; give it every region's pool state."""
        self._keep_polling()
        if demand and self.warmer is not None:
            self.warmer.note_demand(demand)
        if outcomes:
            self.serve.note_traffic()
        if not self.serve.polled.is_set():
            # Right after a (re)start nothing is known yet: "all cold" would send requests to
            # cold regions that a warm one could serve. Wait for Serve's state, briefly.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.serve.polled.wait(), FIRST_POLL_TIMEOUT_S)
        self._board.report(outcomes)
        return self._board.snapshot()

    async def snapshot(self) -> tuple[int, FaultEntries]:
        """The colo fault drills and their version."""
        return self._colo_faults.version, self._colo_faults.entries

    async def colo_faults(self, known_version: int) -> tuple[int, FaultEntries]:
        """Long poll for routers: returns when the colo drills changed since `known_version`,
        or after a while."""
        await self._colo_faults.changed_since(known_version, FAULT_POLL_TIMEOUT_S)
        return self._colo_faults.version, self._colo_faults.entries

    async def set_fault(self, colo_id: str, fault: dict[str, Any]) -> int:
        return self._colo_faults.set(colo_id, fault)

    async def clear_faults(self, colo_id: str) -> int:
        return self._colo_faults.clear(colo_id)

    async def set_region_fault(self, region: str, fault: dict[str, Any]) -> int:
        return self._region_faults.set(region, fault)

    async def clear_region_faults(self, region: str) -> int:
        return self._region_faults.clear(region)

    async def regions(self) -> list[dict[str, Any]]:
        """The admin view: per region and model, replicas running/wanted, health, faults, and how
        fresh the view of Serve is (a failed read shows the last good one, never an error)."""
        self._keep_polling()
        # A read stuck on a restarting controller must not hold the admin answer: past the
        # timeout the last good view is shown (the read goes on and lands on the board).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.serve.refresh()), ADMIN_READ_TIMEOUT_S)
        now = self._wall_clock()
        serve_view = self.serve.describe()
        described = self._board.describe()
        for region in described:
            region["faults"] = [
                describe_fault(entry, now)
                for entry in self._region_faults.entries.get(region["region"], [])
                if fault_window(entry, now)[1] > now
            ]
            region["serve_view"] = serve_view
            if self.warmer is not None:  # a hold of deployments.control.prewarm in flight there now
                held = set(self.warmer.held)
                for model, pool in region["models"].items():
                    pool["prewarm_held"] = (model, region["region"]) in held
        return described

    async def report_traffic(self, replica_id: str, snapshot: dict[str, Any]) -> None:
        self._traffic[replica_id] = (self._clock(), snapshot)

    async def traffic(self) -> dict[str, dict[str, Any]]:
        """The latest snapshot of every router replica still publishing, by replica id."""
        oldest = self._clock() - TRAFFIC_STALE_S
        self._traffic = {r: entry for r, entry in self._traffic.items() if entry[0] >= oldest}
        return {replica: snapshot for replica, (_, snapshot) in self._traffic.items()}

    # ---- model replicas -----------------------------------------------------------------------

    async def region_faults(self, region: str, known_version: int) -> tuple[int, list[Any]]:
        """Long poll: returns when the drills changed since `known_version`, or after a while."""
        await self._region_faults.changed_since(known_version, FAULT_POLL_TIMEOUT_S)
        return self._region_faults.version, self._region_faults.entries.get(region, [])

    # ---- Serve's state ------------------------------------------------------------------------

    def _keep_polling(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self.serve.run())
        if self.warmer is not None and (self._warming is None or self._warming.done()):
            self._warming = asyncio.get_running_loop().create_task(self.warmer.run())
