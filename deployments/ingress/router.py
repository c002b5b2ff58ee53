"""The router's Ray Serve deployment, the HTTP ingress (behind HAProxy or Serve's proxy, and on a
port of its own with `router.listener`): it takes the model deployments' handles, builds the
services (which hold each handle as its deployment's typed client,
deployments.ingress.edge.clients) and the FastAPI app once
(`deployments.ingress.api.app.make_app`), and keeps fault drills in sync across router replicas.
The request path lives in `deployments.ingress.api` (routes), `deployments.ingress.serving`
(services) and `deployments.ingress.edge` (dispatch): route -> service -> dispatch -> typed
client (deployments.contracts) -> replica (docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.config import AppConfig
from deployments.config.state import DATABASE_URL_ENV
from deployments.ingress.api.app import make_app
from deployments.ingress.api.listener import RouterListener
from deployments.ingress.cache import open_cache_store
from deployments.ingress.security import KeyStore, on_kubernetes
from deployments.ingress.serving.models import DeploymentState, DeploymentStates
from deployments.ingress.serving.services import build_services
from deployments.ingress.state.gateway import GatewayState, database_url, open_database
from deployments.observability import RayServeMetricsBackend, RouterObservability
from deployments.ray_ext.router_metrics import sample_queue_before_push_at_zero
from deployments.ray_ext.serve_details import DeploymentReader

log = logging.getLogger("ray.serve")


def _router_replicas() -> int:
    """How many router replicas share each key's rate limit (1 outside Ray Serve)."""
    try:
        return max(1, int(serve.get_replica_context().world_size or 1))
    except (RuntimeError, AttributeError, TypeError):
        return 1


def _deployment_states() -> DeploymentStates:
    """The model deployments of this application, as Ray Serve's controller reports them: read
    as plain JSON (deployments.ray_ext.serve_details; `serve.status()` costs ~100x the CPU), in a
    worker thread since the read blocks."""
    read = DeploymentReader(lambda: serve.get_replica_context().app_name)

    async def states() -> dict[str, DeploymentState]:
        deployments = await asyncio.to_thread(read)
        return {
            name: DeploymentState(d.status, d.running, dict(d.replica_states))
            for name, d in deployments.items()
        }

    return states


@serve.ingress()
class RouterIngress:
    def __init__(
        self,
        config: dict[str, Any],
        servers: Mapping[str, Mapping[str, DeploymentHandle]],
        control: DeploymentHandle | None = None,
        warm_pool: DeploymentHandle | None = None,
        front_spare: DeploymentHandle | None = None,
    ):
        self.config = AppConfig.model_validate(config)
        # Our model handles live here: a request at zero replicas must reach the controller now.
        sample_queue_before_push_at_zero()
        self.state = _gateway_state(self.config)
        observability = RouterObservability(
            self.config.observability,
            self.config.models,
            ledger=self.state.ledger if self.state is not None else None,
        )
        keys = KeyStore.from_env(
            os.environ,
            self.config.security,
            log,
            virtual=self.state.follower if self.state is not None else None,
        )
        self.services = build_services(
            self.config,
            servers,
            keys=keys,
            control=control,
            warm_pool=warm_pool,
            front_spare=front_spare,
            observability=observability,
            deployment_states=_deployment_states(),
            rate_limit_share=1 / _router_replicas(),
            cache_store=open_cache_store(self.config, os.environ),
            state=self.state,
        )
        self._fault_sync: asyncio.Task[None] | None = None
        self._traffic_publish: asyncio.Task[None] | None = None
        self._batch_runs: asyncio.Task[None] | None = None
        self._listener: RouterListener | None = None

    async def __serve_build_asgi_app__(self) -> FastAPI:
        """Called by Ray Serve once the replica is constructed, on its event loop."""
        loop = asyncio.get_running_loop()
        if self.state is not None:
            self.state.start()
        self._fault_sync = loop.create_task(self.services.drills.sync_forever())
        self._traffic_publish = loop.create_task(self.services.dashboard.traffic.publish_forever())
        if self.services.batch_runner is not None:
            self._batch_runs = loop.create_task(self.services.batch_runner.run_forever())
        app = make_app(self.config, self.services)
        if self.config.router.listener.enabled:
            self._listener = RouterListener(app, self.config.router.listener)
            self._listener.start()
        return app

    async def __del__(self) -> None:
        """Ray Serve's graceful shutdown of the replica: the queued ledger records written. A
        batch item in flight is dropped: its job's lease runs out and another replica reruns it.
        The own listener stops first, letting its requests in flight finish, then the cache
        writes they left behind their responses."""
        if self._listener is not None:
            await self._listener.stop()
        await self.services.settled()
        if self._batch_runs is not None:
            self._batch_runs.cancel()
        if self.state is not None:
            await self.state.close()


def _gateway_state(config: AppConfig) -> GatewayState | None:
    """The replica's gateway state (docs/gateway-state.md), or None with `state.enabled` off."""
    if not config.state.enabled:
        return None
    if on_kubernetes(os.environ) and database_url(config.state, os.environ) is None:
        log.warning(
            "state: no %s on Kubernetes: keys, budgets and the request log stay in each "
            "router pod's own SQLite file (docs/kubernetes.md, the database Secret)",
            DATABASE_URL_ENV,
        )
    database = open_database(config.state, config.data_path, os.environ)
    return GatewayState.build(
        config.state,
        database,
        config.security,
        config.observability.prices,
        metrics_backend=RayServeMetricsBackend() if config.observability.metrics else None,
    )
