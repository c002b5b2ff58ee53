"""What every model replica shares: load the runtime once, time it, report health and limits."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar

from deployments.config import BatchingConfig
from deployments.contracts.edge_control_deployment import EdgeControlClient
from deployments.contracts.replies import Reply, StartPhases
from deployments.contracts.session_config import SessionConfig
from deployments.observability import ModelObservability, ObservabilityConfig
from deployments.replica.faults import ReplicaFaultGate
from deployments.replica.process import process_age_s

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle


class Runtime(Protocol):
    def describe(self) -> dict[str, Any]: ...


MAX_HOLD_S = 300.0  # a hold left by an edge-control that went away ends on its own
R = TypeVar("R", bound=Runtime)
T = TypeVar("T")
RuntimeFactory = Callable[[Path, SessionConfig], R]


class ModelServer(Generic[R]):
    """Base of the model deployments. Each names its runtime (`RUNTIME`); a constructor argument
    overrides it, so tests can serve a fake without Ray Serve knowing the difference."""

    TASK = "chat"
    RUNTIME: ClassVar[type[Any]]  # called as RUNTIME(model_dir, session)

    def __init__(
        self,
        model_dir: str,
        session: SessionConfig,
        runtime_factory: RuntimeFactory | None = None,
        observability: dict[str, Any] | None = None,
        model_name: str | None = None,
        region: str | None = None,
        control: DeploymentHandle[Any] | None = None,
    ):
        """region / control: the region this replica serves and the edge-control handle its
        fault drills come from (both None without regions: no drills reach the replica)."""
        process_s = process_age_s()
        started = time.perf_counter()
        self.model_dir = Path(model_dir)
        self.model_name = model_name or self.model_dir.name
        self.runtime: R = (runtime_factory or self.RUNTIME)(self.model_dir, session)
        self.load_s = time.perf_counter() - started
        self.ready_at = time.time()
        described = self.runtime.describe()
        warmup_s = float(described.get("warmup_s") or 0.0)
        self.phases = StartPhases(
            process_s=process_s,
            model_load_s=float(described.get("load_s") or self.load_s - warmup_s),
            warmup_s=warmup_s,
            init_s=self.load_s,
        )
        self.batching = BatchingConfig()
        self.faults = ReplicaFaultGate(
            region, EdgeControlClient(control) if control is not None else None
        )
        self.pid = os.getpid()
        self.observability = ModelObservability(
            ObservabilityConfig.model_validate(observability or {}),
            self.model_name,
            self.TASK,
        )

    def reply(self, value: T) -> Reply[T]:
        return Reply(value, self.ready_at, self.load_s, self.phases)

    def reconfigure(self, user_config: dict[str, Any]) -> None:
        """Ray Serve calls this with the deployment's `user_config` on start and on every change."""
        batching = BatchingConfig.model_validate(user_config or {})
        self._apply_batching(batching)  # may refuse it (a KV budget this host cannot hold)
        self.batching = batching

    def _apply_batching(self, batching: BatchingConfig) -> None:
        """Subclasses push the new batch limits into their batchers."""

    async def check_health(self) -> None:
        # A replica whose runtime raises here is replaced by Ray Serve.
        self.runtime.describe()

    async def wake(self) -> float:
        """A no-op call that queues while the deployment is at zero, so Serve scales it up: the
        router wakes a cold region this way while a warm neighbour serves. Returns ready_at."""
        return self.ready_at

    async def hold(self, seconds: float) -> float:
        """Stay in flight for `seconds` (at most MAX_HOLD_S), then return ready_at: Serve counts
        a call in flight as an ongoing request, so while edge-control holds one here its
        autoscaler keeps this deployment at one replica at least (deployments.control.prewarm)."""
        await asyncio.sleep(min(max(0.0, seconds), MAX_HOLD_S))
        return self.ready_at

    async def describe(self) -> dict[str, Any]:
        return {
            **self.runtime.describe(),
            "model_dir": str(self.model_dir),
            "replica_load_s": self.load_s,
            "start_phases": self.phases.as_dict(),
            "pid": self.pid,
            "region": self.faults.region,
            "batching": self.batching.model_dump(),
        }


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run blocking inference off the event loop, so the replica keeps accepting requests."""
    return await asyncio.to_thread(fn, *args)
