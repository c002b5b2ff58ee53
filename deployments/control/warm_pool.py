"""Warm worker pool: a few idle Ray worker processes per node, started ahead with the replica code
already imported, so a model replica started from zero takes one instead of a new process.

How it works (Ray 2.60, measured: docs/operating.md, "Cold starts"):
- Each node's raylet is asked (its `PrestartWorkers` gRPC, which Ray's Python API does not
  expose: `deployments.ray_ext.raylet`) for fresh workers of no job, with the model replicas'
  runtime_env and a keep-alive, so the raylet's idle-worker reaper leaves them alone. A fresh
  worker fits any job's actor whose runtime_env is the same (the raylet compares a hash of it);
  a worker that ran a task does not (it is then an actor-less worker of that job), which is why
  a warm-up *task* cannot do this.
- The runtime_env carries Ray's worker setup hook, `deployments.control.warm_pool.preload`, which
  each such worker runs before it takes work: Ray Serve's replica machinery, ONNX Runtime,
  tokenizers and our model servers are imported while the worker idles, not while a request waits.
- `WarmPool`, a tiny Serve deployment, tops each node up to `workers_per_node` such workers every
  `check_interval_s` while a pool fills, refills or the nodes change, less often (doubling up to
  `idle_check_interval_s`) while every pool stays full, and at once when `top_up()` is called
  (the router does after each cold start, whose replica took a worker). A worker taken is
  replaced only `refill_delay_s` later: its replacement's start-up (a process and its imports,
  about a second of CPU) would otherwise compete with the new replica's first requests.
- After importing, the hook freezes those objects out of the garbage collector (`gc.freeze`):
  the full `gc.collect()` Ray Serve runs once a replica is constructed then skips them.

The model replicas and the pool get the same runtime_env (`warm_runtime_env`, merged by Serve with
the app's own), and the pool prestarts workers with exactly the runtime_env it runs in itself.
Raylets report no worker's runtime_env, so the pool counts as its own the fresh workers that
appear on a node while it has asked for some there (`NodePool`); fresh workers it found there
otherwise (Ray prestarts one per CPU when a node starts) are not counted.
"""

from __future__ import annotations

import gc
import importlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from deployments.config.warm_pool import WarmPoolConfig
from deployments.pacing import PollPacer
from deployments.ray_ext.raylet import RayletClient, missing_rpcs
from deployments.ray_ext.worker_setup import SERVE_REPLICA_MODULE, setup_hook_env_var

logger = logging.getLogger("ray.serve")

SETUP_HOOK = "deployments.control.warm_pool.preload"

# What a model replica imports before its __init__ runs, heaviest first.
PRELOAD_MODULES: tuple[str, ...] = (
    SERVE_REPLICA_MODULE,
    "onnxruntime",
    "onnx",  # a chat runtime rewrites its graph's head at load (replica/engine/next_token_graph.py)
    "tokenizers",
    "deployments.replica.batched",
    "deployments.replica.chat",
)


def preload(modules: Sequence[str] = PRELOAD_MODULES) -> None:
    """The worker setup hook: import what a replica will need. A module that fails to import is
    logged and skipped: a worker that raised here would be killed, and the pool would churn."""
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # any import error: the replica will meet it again and report it
            logger.exception("warm pool: preloading %s failed", module)
    # Ray Serve runs a full gc.collect() (then gc.freeze()) once a replica is constructed: over
    # everything imported above that is 70-110 ms of the cold start. Frozen now, while the
    # worker idles, those objects are left out of that collection.
    gc.collect()
    gc.freeze()


def warm_runtime_env(runtime_env: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`runtime_env` with the preload hook added: the replicas' and the pool's runtime_env."""
    env = dict(runtime_env or {})
    # Set as a variable: Ray turns no runtime_env field into it here (ray_ext.worker_setup).
    env["env_vars"] = {**dict(env.get("env_vars") or {}), setup_hook_env_var(): SETUP_HOOK}
    return env


@dataclass(frozen=True)
class NodeAddress:
    node_id: str
    address: str  # host:port of the raylet's gRPC server


def nodes_with_cpus() -> list[NodeAddress]:
    """Alive nodes a model replica can run on (a head node started with 0 CPUs cannot)."""
    import ray

    return [
        NodeAddress(node["NodeID"], f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}")
        for node in ray.nodes()
        if node.get("Alive") and node.get("Resources", {}).get("CPU", 0) > 0
    ]


class NodePool:
    """One node's share of the pool: which fresh workers are ours and how many to ask for."""

    def __init__(self, target: int, start_grace_s: float, refill_delay_s: float = 0.0):
        self.target = target
        self.start_grace_s = start_grace_s
        self.refill_delay_s = refill_delay_s
        self.ours: set[int] = set()
        self._seen: set[int] = set()
        self._asked_at: list[float] = []  # one entry per worker asked for and not seen yet
        self._refill_at = 0.0  # no replacement asked for before this

    def missing(self, fresh_idle: Sequence[int], now: float) -> int:
        """Given the node's fresh idle workers now, how many to ask for (and note them asked)."""
        self._asked_at = [at for at in self._asked_at if now - at < self.start_grace_s]
        for pid in fresh_idle:
            if pid not in self._seen and self._asked_at:
                self._asked_at.pop(0)  # it answers our oldest request
                self.ours.add(pid)
        self._seen = set(fresh_idle)  # a worker leaves this set only when taken or gone
        if self.ours - self._seen:  # taken by a replica starting now: replace it later
            self._refill_at = now + self.refill_delay_s
        self.ours &= self._seen
        if now < self._refill_at:
            return 0
        count = max(0, self.target - len(self.ours) - len(self._asked_at))
        self._asked_at += [now] * count
        return count

    @property
    def starting(self) -> int:
        return len(self._asked_at)

    def full(self, now: float) -> bool:
        """The target reached, with no worker asked for and no replacement waiting."""
        return not self._asked_at and len(self.ours) >= self.target and now >= self._refill_at


class PoolKeeper:
    """Tops every node with CPUs up to `workers_per_node` warm workers, one round per call."""

    def __init__(
        self,
        config: WarmPoolConfig,
        runtime_env: str,
        raylet: Callable[[str], RayletClient] = RayletClient,
        nodes: Callable[[], list[NodeAddress]] = nodes_with_cpus,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.runtime_env = runtime_env
        self._raylet = raylet
        self._nodes = nodes
        self._clock = clock
        self._clients: dict[str, RayletClient] = {}
        self._pools: dict[str, NodePool] = {}
        self._pacer = PollPacer(config.check_interval_s, config.idle_check_interval_s)

    @property
    def wait_s(self) -> float:
        """How long to wait before the next round."""
        return self._pacer.interval_s

    def top_up(self) -> dict[str, int]:
        """One round over the nodes; returns the workers asked for per node. The next round
        comes `check_interval_s` later unless every node's pool was full and the nodes were
        those of the round before, then twice the last wait (up to `idle_check_interval_s`)."""
        asked = {}
        nodes = self._nodes()
        busy = {node.node_id for node in nodes} != set(self._pools)
        for node in nodes:
            client = self._clients.get(node.node_id)
            if client is None:
                client = self._clients[node.node_id] = self._raylet(node.address)
            pool = self._pools.setdefault(
                node.node_id,
                NodePool(
                    self.config.workers_per_node,
                    self.config.start_grace_s,
                    self.config.refill_delay_s,
                ),
            )
            now = self._clock()
            count = pool.missing(client.fresh_idle_workers(), now)
            if count:
                client.prestart(count, self.runtime_env, self.config.keep_alive_s)
            asked[node.node_id] = count
            busy = busy or not pool.full(now)
        for gone in set(self._pools) - set(asked):
            del self._pools[gone]
            self._clients.pop(gone, None)
        self._pacer.after_read(busy=busy)
        return asked

    def failed(self) -> None:
        """A round that raised: the next one comes soon."""
        self._pacer.after_read(busy=True)

    def describe(self) -> dict[str, Any]:
        return {
            "workers_per_node": self.config.workers_per_node,
            "nodes": {
                node: {"idle": sorted(pool.ours), "starting": pool.starting}
                for node, pool in self._pools.items()
            },
        }


class WarmPool:
    """The Ray Serve deployment (one replica, no CPU): `PoolKeeper` rounds in a thread (its RPCs
    block), with the runtime_env it runs in itself -
    exactly the string the model replicas get, which is what the raylet compares. On a Ray
    without the raylet RPCs it needs, it says so and keeps no workers: replicas start as usual."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        import ray

        self.config = WarmPoolConfig.model_validate(config or {})
        runtime_env = ray.get_runtime_context().get_runtime_env_string() or "{}"
        self.keeper = PoolKeeper(self.config, runtime_env)
        self.failed_rounds = 0
        self.unavailable = missing_rpcs()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warm-pool", daemon=True)
        if self.unavailable is None:
            self._thread.start()
        else:
            logger.warning("warm pool off: %s", self.unavailable)

    def _run(self) -> None:
        while True:
            try:
                self.keeper.top_up()
            except Exception:  # noqa: BLE001 - gRPC or GCS hiccup: retried next round
                self.failed_rounds += 1
                self.keeper.failed()
                logger.warning("warm pool: top-up round failed", exc_info=True)
            self._wake.wait(self.keeper.wait_s)
            self._wake.clear()

    async def top_up(self) -> None:
        """Check now rather than at the next interval (e.g. a region's replica is starting)."""
        self._wake.set()

    async def describe(self) -> dict[str, Any]:
        described = {**self.keeper.describe(), "failed_rounds": self.failed_rounds}
        if self.unavailable is not None:
            described["unavailable"] = self.unavailable
        return described

    async def check_health(self) -> None:
        if self.unavailable is None and not self._thread.is_alive():
            raise RuntimeError("the warm pool's top-up thread died")
