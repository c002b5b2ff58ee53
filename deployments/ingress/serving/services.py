"""All of the router's services, built once from the validated config and the model handles."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deployments.config import AppConfig
from deployments.contracts.edge_control_deployment import EdgeControlClient
from deployments.contracts.front_spare_deployment import FrontSpareClient
from deployments.contracts.warm_pool_deployment import WarmPoolClient
from deployments.ingress.cache import ResponseCache, SharedStore, SingleFlight
from deployments.ingress.edge.clients import model_clients
from deployments.ingress.edge.dispatch import EdgeDispatcher
from deployments.ingress.edge.fair_queue import FairGates
from deployments.ingress.edge.pools import RegionPools
from deployments.ingress.security import KeyStore, ModerationGate, RateLimiter
from deployments.ingress.security.gate_classifier import (
    OpenClassifier,
    in_router_classifier,
    open_embedded_classifier,
)
from deployments.ingress.serving.admission import Admission
from deployments.ingress.serving.batch import BatchService
from deployments.ingress.serving.batch_runner import BatchRunner
from deployments.ingress.serving.caching import CachedAnswers
from deployments.ingress.serving.chat import ChatService
from deployments.ingress.serving.dashboard import DashboardService, RegionsSource, TrafficShare
from deployments.ingress.serving.drills import FaultDrills
from deployments.ingress.serving.gateway_admin import GatewayAdmin
from deployments.ingress.serving.models import (
    DeploymentState,
    DeploymentStates,
    ModelCatalogue,
    ServedModel,
)
from deployments.ingress.serving.moderation_deployment import ModerationDeployment
from deployments.ingress.serving.texts import EmbeddingService, ModerationService
from deployments.ingress.serving.workers_ai import WorkersRun
from deployments.ingress.state.gateway import GatewayState
from deployments.observability import RouterObservability
from deployments.observability.recent_traffic import RecentTraffic
from edge_sim.network import EdgeNetwork

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle


@dataclass(frozen=True)
class RouterServices:
    keys: KeyStore
    catalogue: ModelCatalogue
    chat: ChatService
    embeddings: EmbeddingService
    moderations: ModerationService
    drills: FaultDrills
    dashboard: DashboardService
    pools: RegionPools
    deployment_states: DeploymentStates
    gateway: GatewayAdmin  # the admin API of keys, logs and usage
    workers: WorkersRun  # /ai/run's inputs and answers, a client's or a batch item's
    batch: BatchService  # the Batch API's submissions and polls
    observability: RouterObservability | None = None
    warm_pool: WarmPoolClient | None = None  # deployments.control.warm_pool; None when it is off
    front_spare: FrontSpareClient | None = None  # deployments.control.front_spare; None: off
    state: GatewayState | None = None  # keys, budgets and the request log; None when off
    batch_runner: BatchRunner | None = None  # runs batch jobs; None with state or batch off

    async def settled(self) -> None:
        """Until the work requests left behind their responses is done (their telemetry, the
        response cache's writes, each bounded by its timeout): a replica that shuts down, and
        tests."""
        if self.observability is not None:
            self.observability.flush()
        await self.embeddings.cached.flights.settled()  # one CachedAnswers for every service

    async def readiness(self) -> dict[str, Any]:
        states = await self.deployment_states()
        ready = self.catalogue.readiness(states, self.pools.last_cold_start)
        # A failing call raises to the route's error handler, which maps it like a model call's.
        pool = await self.warm_pool.describe() if self.warm_pool is not None else None
        return {**ready, "warm_pool": pool, "front_spare": await self._front_spare()}

    async def _front_spare(self) -> dict[str, Any] | None:
        """The second HAProxy's state. Not a condition of this router's readiness: a replica of
        it restarting is said, not raised."""
        if self.front_spare is None:
            return None
        try:
            return await self.front_spare.describe()
        except Exception as error:  # noqa: BLE001 - any failure of the call: say it
            return {"running": False, "error": f"{type(error).__name__}: {error}"[:300]}


async def _no_deployments() -> Mapping[str, DeploymentState]:
    return {}


def build_services(
    config: AppConfig,
    handles: Mapping[str, Mapping[str, DeploymentHandle[Any]]],
    *,
    keys: KeyStore,
    control: DeploymentHandle[Any] | None = None,
    warm_pool: DeploymentHandle[Any] | None = None,
    front_spare: DeploymentHandle[Any] | None = None,
    observability: RouterObservability | None = None,
    deployment_states: DeploymentStates = _no_deployments,
    rate_limit_share: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    regions: RegionsSource | None = None,
    open_gate_classifier: OpenClassifier = open_embedded_classifier,
    cache_store: SharedStore | None = None,
    state: GatewayState | None = None,
) -> RouterServices:
    """`handles`: model -> region -> the handle of that model's deployment in that region.
    `control`: the edge-control deployment, where routers share region state and drills.
    `front_spare`: the second HAProxy's deployment, whose state /readyz shows.
    `rate_limit_share`: this replica's part of each key's budget (1/N with N router replicas).
    `clock`: the rate limiter's (tests). `regions`: real regions for the dashboard (default:
    /admin/regions from edge-control when there is one; None: the cluster as one region).
    `open_gate_classifier`: opens the moderation gate's model in this process when it is small
    enough to (tests pass a fake). `cache_store`: the response cache's shared tier
    (`open_cache_store`; None: this process's memory alone). `state`: the gateway's database
    (virtual keys' budgets, the admin API of keys, logs and usage); None: off."""
    router, edge_config = config.router, config.edge
    deployments: dict[str, dict[str, str]] = {}
    for deployment, (model, region) in config.model_deployments().items():
        deployments.setdefault(model, {})[region] = deployment
    catalogue = ModelCatalogue(
        {
            name: ServedModel(
                name,
                m.task,
                m.family,
                aliases=m.aliases,
                categories=m.categories,
                description=m.description,
            )
            for name, m in config.models.items()
        },
        created=int(time.time()),
        deployments=deployments,
    )
    network = EdgeNetwork(edge_config)
    # one client of edge-control for the region pools, the drills and the dashboard's traffic
    control_client = EdgeControlClient(control) if control is not None else None
    pool_client = WarmPoolClient(warm_pool) if warm_pool is not None else None
    pools = RegionPools(
        model_clients(config, handles),
        edge_config.region_policy,
        router.default_cold_start_ms,
        control=control_client,
        warm_pool=pool_client,
    )
    edge = EdgeDispatcher(
        network,
        edge_config.region_map(),
        pools,
        max_attempts=router.failover_attempts,
        deadline_s=router.request_timeout_s,
        max_extra_rtt_ms=edge_config.routing.max_extra_rtt_ms,
        gate=fair_gates(config, pools),
        attempt_timeouts_s={
            name: model.attempt_timeout_s
            for name, model in config.models.items()
            if model.attempt_timeout_s is not None
        },
    )
    metrics = observability.metrics if observability is not None else None
    cache = ResponseCache(
        router.cache,
        cache_store,
        on_failure=metrics.cache_backend_failure if metrics is not None else None,
    )
    cached = CachedAnswers(SingleFlight(cache, router.cache.single_flight))
    security = config.security
    admission = Admission(
        RateLimiter(clock=clock, share=rate_limit_share),
        security.request_limits,
        catalogue,
        budgets=state.budgets if state is not None else None,
    )
    gate_config = security.moderation_gate

    in_router = (  # the config names a served moderation model whenever the gate is on
        in_router_classifier(
            gate_config, config.model_path(gate_config.moderation_model), open_gate_classifier
        )
        if gate_config.models
        else None
    )

    # the gate's classifier: the router's own copy of a small enough model, else its deployment
    classify = in_router or ModerationDeployment(pools, gate_config.moderation_model)
    on_gate_failure = metrics.moderation_gate_failure if metrics is not None else None

    drills = FaultDrills(network, control_client, edge_config.region_names)
    if regions is None and control_client is not None and edge_config.regions is not None:
        regions = drills.region_states
    recent = observability.recent if observability is not None else RecentTraffic()
    dashboard = DashboardService(
        drills,
        list(catalogue.models),
        deployment_states,
        TrafficShare(recent, control_client),
        pools.last_cold_start,
        regions=regions,
    )
    path = (catalogue, admission, cached, edge)  # what every service's request path goes through
    workers = WorkersRun(
        catalogue,
        ChatService(*path, gate=ModerationGate(gate_config, classify, on_gate_failure)),
        EmbeddingService(*path),
        ModerationService(*path),
    )
    runner = None
    if state is not None and state.config.batch.enabled:
        runner = BatchRunner(
            state.batches,
            workers,
            pools,
            keys,
            state.config.batch,
            ready=state.ensure_ready,
            observability=observability,
            wall_clock=state.wall_clock,
        )
    return RouterServices(
        keys=keys,
        catalogue=catalogue,
        chat=workers.chat,
        embeddings=workers.embeddings,
        moderations=workers.moderations,
        drills=drills,
        dashboard=dashboard,
        pools=pools,
        deployment_states=deployment_states,
        observability=observability,
        warm_pool=pool_client,
        front_spare=FrontSpareClient(front_spare) if front_spare is not None else None,
        state=state,
        gateway=GatewayAdmin(catalogue, state),
        workers=workers,
        batch=BatchService(workers, state, wall_clock=state.wall_clock if state else time.time),
        batch_runner=runner,
    )


def fair_gates(config: AppConfig, pools: RegionPools) -> FairGates | None:
    """The fair queue in front of each model of `router.fair_queue.tasks`; None when it is off."""
    fair = config.router.fair_queue
    if not fair.enabled:
        return None
    gated = [name for name, model in config.models.items() if model.task in fair.tasks]
    return FairGates(fair, gated, pools.pools, routers=lambda: pools.snapshot.routers)
