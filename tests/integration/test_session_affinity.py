"""Session affinity inside real Serve, on the session's cluster: a deployment routed by
`SessionAffinityRouter` (what every chat pool uses) sends each session's calls to one replica and
spreads calls without a session over all of them. A small app of its own (three replicas that
name themselves), deleted afterwards. The header and the ranking:
tests/unit/test_session_router.py."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO

CHECK = """
import asyncio, json, os
os.environ["RAY_AUTH_MODE"] = "token"
import ray
from ray import serve
from deployments.contracts.session_router import SessionAffinityRouter

ray.init(address="auto", logging_level="ERROR")
ROUTER = f"{SessionAffinityRouter.__module__}.{SessionAffinityRouter.__qualname__}"


@serve.deployment(
    num_replicas=3,
    ray_actor_options={"num_cpus": 0.01},
    request_router_config={"request_router_class": ROUTER},
)
class Who:
    async def __call__(self, hold_s: float = 0.0) -> str:
        await asyncio.sleep(hold_s)
        return serve.get_replica_context().replica_id.unique_id


# Calls without a session until all three replicas answered: a new handle's view of the
# replicas grows as Serve tells it, and sessions are ranked over the replicas it knows.
def heard_from(handle) -> list:
    seen = set()
    for _ in range(200):
        seen.add(handle.remote().result())
        if len(seen) == 3:
            break
    return sorted(seen)


handle = serve.run(Who.bind(), name="session-affinity-check", route_prefix=None)
try:
    anonymous = heard_from(handle)
    sessions = {}
    for i in range(12):
        pinned = handle.options(session_id=f"ses_{i}")
        sessions[f"ses_{i}"] = sorted({pinned.remote().result() for _ in range(6)})
finally:
    serve.delete("session-affinity-check")

# One request at a time per replica; five at once of one session, each holding its replica
# 0.5 s: its own replica and its next two take three, the other two wait (backing off), none
# is lost.
narrow = Who.options(max_ongoing_requests=1).bind()
handle = serve.run(narrow, name="session-affinity-busy", route_prefix=None)
try:
    heard_from(handle)
    pinned = handle.options(session_id="ses_busy")
    held = [pinned.remote(0.5) for _ in range(5)]
    busy = sorted({response.result(timeout_s=60) for response in held})
finally:
    serve.delete("session-affinity-busy")
print(json.dumps({"sessions": sessions, "anonymous": anonymous, "busy": busy}))
"""


def test_a_session_s_calls_go_to_one_replica_and_calls_without_one_spread(serve_cluster):
    """And a session whose replica is full (max_ongoing_requests) goes to its next ones."""
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        env=serve_cluster.env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(len(replicas) == 1 for replicas in seen["sessions"].values()), seen
    owners = {replicas[0] for replicas in seen["sessions"].values()}
    assert len(owners) >= 2, seen  # twelve sessions do not all hash to one of three replicas
    assert len(seen["anonymous"]) == 3, seen  # calls without a session reach all three
    assert len(seen["busy"]) == 3, seen  # a full replica passed its session's requests on
