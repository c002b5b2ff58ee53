"""The two raylet RPCs the warm worker pool needs, over Ray's own (token-authenticated) channel.

No public API serves: Ray's Python API cannot ask a node for idle workers ahead of need
(`PrestartWorkers`, with a runtime_env and a keep-alive) nor list a node's workers with what they
ran (`GetNodeStats`; `ray.util.state.list_workers` has no executed-task count and goes through the
dashboard). Both are the raylet's gRPC service, reached with Ray's private channel helper, which
attaches the cluster's token. `missing_rpcs()` says what this Ray lacks: the pool then stays off.
"""

from __future__ import annotations

# What the pool reads and sends; `missing_rpcs` checks each is still in this Ray's protos.
_STUB_METHODS = ("GetNodeStats", "PrestartWorkers")
_PRESTART_FIELDS = ("language", "runtime_env_info", "keep_alive_duration_secs", "num_workers")
_WORKER_STATS_FIELDS = ("pid", "actor_id", "job_id", "num_executed_tasks", "worker_type")


def missing_rpcs() -> str | None:
    """None when this Ray has the channel helper, RPCs and message fields used below; else what
    is missing, in words. Needs no cluster."""
    try:
        from ray._private.grpc_utils import init_grpc_channel  # noqa: F401
        from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc
    except ImportError as exc:
        return f"Ray's raylet client modules are gone ({exc})"
    service = node_manager_pb2.DESCRIPTOR.services_by_name.get("NodeManagerService")
    if service is None or not hasattr(node_manager_pb2_grpc, "NodeManagerServiceStub"):
        return "Ray has no NodeManagerService"
    for method in _STUB_METHODS:
        if method not in service.methods_by_name:
            return f"the raylet has no {method} RPC"
    messages = (
        (node_manager_pb2.PrestartWorkersRequest, _PRESTART_FIELDS),
        (common_pb2.CoreWorkerStats, _WORKER_STATS_FIELDS),
        (node_manager_pb2.GetNodeStatsReply, ("core_workers_stats",)),
    )
    for message, fields in messages:
        for field in fields:
            if field not in message.DESCRIPTOR.fields_by_name:
                return f"{message.DESCRIPTOR.name} has no field {field}"
    return None


class RayletClient:
    """One node's raylet, at `address` (host:port of its gRPC server)."""

    def __init__(self, address: str, timeout_s: float = 10.0):
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import node_manager_pb2_grpc

        self._stub = node_manager_pb2_grpc.NodeManagerServiceStub(init_grpc_channel(address))
        self._timeout_s = timeout_s

    def fresh_idle_workers(self) -> list[int]:
        """Pids of the node's registered workers that no job has used yet: no actor, no task."""
        from ray.core.generated import common_pb2, node_manager_pb2

        reply = self._stub.GetNodeStats(
            node_manager_pb2.GetNodeStatsRequest(include_memory_info=False),
            timeout=self._timeout_s,
        )
        return [
            stats.pid
            for stats in reply.core_workers_stats
            if is_nil(stats.actor_id)
            and is_nil(stats.job_id)
            and stats.num_executed_tasks == 0
            and stats.worker_type == common_pb2.WorkerType.WORKER
        ]

    def prestart(self, count: int, runtime_env: str, keep_alive_s: int) -> None:
        """Ask for `count` new workers of no job, with `runtime_env` (serialized JSON)."""
        from ray.core.generated import common_pb2, node_manager_pb2
        from ray.core.generated.runtime_environment_pb2 import RuntimeEnvInfo

        self._stub.PrestartWorkers(
            node_manager_pb2.PrestartWorkersRequest(
                language=common_pb2.Language.PYTHON,
                runtime_env_info=RuntimeEnvInfo(serialized_runtime_env=runtime_env),
                keep_alive_duration_secs=keep_alive_s,
                num_workers=count,
            ),
            timeout=self._timeout_s,
        )


def is_nil(binary_id: bytes) -> bool:
    """Ray's nil ids are all 0xff bytes (a worker no job or actor has claimed)."""
    return not binary_id or binary_id == b"\xff" * len(binary_id)
