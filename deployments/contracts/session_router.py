"""How a chat pool's handles choose a replica: a request of a session (Workers AI's
`x-session-affinity` header, passed as the handle call's `session_id`) goes to the replica its
session hashes to, so the conversation's earlier turns are in that replica's prefix cache; one
without a session goes where Serve's default would send it (the less busy of two at random).

Rendezvous hashing over the running replicas: every router replica ranks them the same way
without sharing state, and a replica that starts or stops moves only the sessions that hashed to
it. A session's replica that is full (its `max_ongoing_requests` reached) passes the request to
the session's next replica, then the next (FALLBACK_REPLICAS), as Serve's routing retries do.
Built on Ray Serve's public request-router API (`ray.serve.request_router`)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from ray.serve.request_router import (
    LocalityMixin,
    PendingRequest,
    RequestRouter,
    RunningReplica,
)

FALLBACK_REPLICAS = 2  # tried in the session's order after its own replica refuses


def session_rank(session: str, replicas: Sequence[RunningReplica]) -> list[RunningReplica]:
    """`replicas` in the session's order of preference (highest rendezvous weight first)."""

    def weight(replica: RunningReplica) -> bytes:
        key = f"{session}\0{replica.replica_id.unique_id}".encode()
        return hashlib.blake2b(key, digest_size=8).digest()

    return sorted(replicas, key=weight, reverse=True)


class SessionAffinityRouter(LocalityMixin, RequestRouter):
    """A chat deployment's `request_router_config.request_router_class`. Each pending request is
    matched to the replica chosen for it (no FIFO hand-over between requests, which would give a
    session's replica to another session's request)."""

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if pending_request is not None and pending_request.metadata.session_id:
            # All of them full: Serve's loop waits (backs off) before asking again, not at once.
            pending_request.routing_context.should_backoff = True
            ranked = session_rank(pending_request.metadata.session_id, candidate_replicas)
            return [[replica] for replica in ranked[: 1 + FALLBACK_REPLICAS]]
        # As Serve's default: this node's replicas first (LocalityMixin), then two at random, the
        # less busy of which serves.
        nearby = self.apply_locality_routing(pending_request)
        choices = [replica for replica in candidate_replicas if replica.replica_id in nearby]
        return [random.sample(choices, min(2, len(choices)))] if choices else []
