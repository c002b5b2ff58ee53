"""One cold-start cycle: a deployment at zero replicas gets one request; the client times it, the
replica's own StartPhases (via the router's /readyz) and the controller's log split the wait
into controller decision, worker process start, model load and warm-up."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from benchmarks.coldstart.cluster import EDGE_APP, EMPTY_APP, EMPTY_ROUTE, replica_states
from benchmarks.coldstart.controller_log import ControllerLog, ScaleUp
from benchmarks.coldstart.empty import EMPTY_DEPLOYMENT
from edgectl.local_cluster import wait_until

WallClock = Callable[[], float]

WAKE_TEXT = "wake up"


@dataclass(frozen=True)
class ColdTarget:
    """A deployment to cold-start and the smallest request that reaches it."""

    app: str
    deployment: str
    path: str
    body: Mapping[str, Any]
    route_prefix: str = ""  # where its application's router answers (/readyz included)

    @property
    def is_model(self) -> bool:
        return self.app != EMPTY_APP


def model_target(name: str, task: str, app: str = EDGE_APP, route_prefix: str = "") -> ColdTarget:
    if task == "chat":
        body: dict[str, Any] = {
            "model": name,
            "messages": [{"role": "user", "content": WAKE_TEXT}],
            "max_tokens": 1,
            "temperature": 0,
        }
        return ColdTarget(app, name, "/v1/chat/completions", body, route_prefix)
    path = {"embedding": "/v1/embeddings", "moderation": "/v1/moderations"}[task]
    return ColdTarget(app, name, path, {"model": name, "input": WAKE_TEXT}, route_prefix)


EMPTY_TARGET = ColdTarget(EMPTY_APP, EMPTY_DEPLOYMENT, EMPTY_ROUTE, {})


class NotAColdStartError(RuntimeError):
    """The request found a replica already running: the cycle measured nothing."""


def cold_start_cycle(
    client: httpx.Client,
    target: ColdTarget,
    controller: ControllerLog,
    wall_clock: WallClock = time.time,
) -> dict[str, Any]:
    """Wake the target (at zero replicas) with one request; its phases in seconds."""
    sent_at = wall_clock()
    response = client.post(target.route_prefix + target.path, json=dict(target.body))
    answered_at = wall_clock()
    if response.status_code != 200:
        raise RuntimeError(f"{target.deployment}: HTTP {response.status_code}: {response.text}")
    if target.is_model:
        replica = _model_replica_start(client, target, response, sent_at)
    else:
        body = response.json()
        replica = {
            "wait_s": body["replica_ready_at"] - sent_at,
            "process_s": body["process_s"],
            "model_load_s": 0.0,
            "warmup_s": 0.0,
            "init_s": 0.0,
        }
    phases = split_phases(
        sent_at=sent_at,
        answered_at=answered_at,
        scale_up=controller.scale_up(target.app, target.deployment, after=sent_at),
        **replica,
    )
    # The cores may be shared: how busy the machine was says how much to trust the cycle.
    phases["load_average_1m"] = round(os.getloadavg()[0], 2)
    return phases


def timed_request(client: httpx.Client, target: ColdTarget) -> float:
    """Seconds for one request to the target, which must answer 200."""
    started = time.monotonic()
    response = client.post(target.route_prefix + target.path, json=dict(target.body))
    elapsed = time.monotonic() - started
    if response.status_code != 200:
        raise RuntimeError(f"{target.deployment}: HTTP {response.status_code}: {response.text}")
    return elapsed


def steady_warm_latency(
    client: httpx.Client,
    target: ColdTarget,
    settled: Callable[[], bool],
    timeout_s: float,
    samples: int = 5,
) -> float:
    """A warm request's seconds (median of `samples`) once the cluster has settled after the
    target's wake-up (`settled`: the warm pool full again), requests sent one at a time all along
    so the target never scales back to zero meanwhile."""
    deadline = time.monotonic() + timeout_s
    timed_request(client, target)
    while not settled() and time.monotonic() < deadline:
        timed_request(client, target)
    return statistics.median(timed_request(client, target) for _ in range(samples))


def _model_replica_start(
    client: httpx.Client, target: ColdTarget, response: httpx.Response, sent_at: float
) -> dict[str, Any]:
    """The router's account of the wait (x-edge-cold-start, /readyz last_cold_start)."""
    if response.headers.get("x-edge-cold-start") != "1":
        raise NotAColdStartError(f"{target.deployment}: the request found a running replica")
    ready = client.get(f"{target.route_prefix}/readyz").json()
    cold = ready["models"][target.deployment]["last_cold_start"]
    if cold is None or cold["at_unix"] < sent_at:
        raise NotAColdStartError(f"{target.deployment}: /readyz has no cold start for it")
    phases = cold["phases"]
    return {
        "wait_s": cold["wait_ms"] / 1000.0,
        "process_s": phases["process_s"],
        "model_load_s": phases["model_load_s"],
        "warmup_s": phases["warmup_s"],
        "init_s": phases["init_s"],
    }


def split_phases(
    *,
    sent_at: float,
    answered_at: float,
    wait_s: float,
    process_s: float | None,
    model_load_s: float,
    warmup_s: float,
    init_s: float,
    scale_up: ScaleUp | None = None,
) -> dict[str, Any]:
    """Where one cold start went, in seconds. `decision_and_scheduling_s`, `process_start_s` and
    the replica's `__init__` (model load, warm-up, the rest) add up to `wait_s`, the request's
    wait for a ready replica; `ready_to_response_s` is the remainder of `total_s`.

    The replica became ready at about `sent_at + wait_s` (`wait_s` counts from the request's
    arrival at whoever timed it) and its process started `init_s + process_s` before that. A
    process older than the request is a reused (prestarted) worker: it had no start to wait for.
    With the controller's log, `decision_and_scheduling_s` splits further into the controller's
    decision, its next loop asking Ray for the actor, and Ray starting the worker process.
    """
    total_s = answered_at - sent_at
    before_init_s = wait_s - init_s
    reused_worker = process_s is not None and process_s > before_init_s
    if process_s is None or reused_worker:
        decision_and_scheduling_s, process_start_s = before_init_s, 0.0
    else:
        decision_and_scheduling_s, process_start_s = before_init_s - process_s, process_s
    ready_at = sent_at + wait_s
    process_started_at = ready_at - init_s - process_start_s
    phases: dict[str, Any] = {
        "total_s": total_s,
        "wait_s": wait_s,
        "decision_and_scheduling_s": decision_and_scheduling_s,
        "controller_decision_s": None,
        "replica_requested_s": None,
        "worker_scheduling_s": None,
        "process_start_s": process_start_s,
        "model_load_s": model_load_s,
        "warmup_s": warmup_s,
        "init_other_s": init_s - model_load_s - warmup_s,
        "ready_to_response_s": total_s - wait_s,
        "ready_to_running_s": None,
        "running_to_response_s": None,
        "reused_worker": reused_worker,
        "process_age_at_init_s": process_s,
    }
    if scale_up is not None:
        phases["controller_decision_s"] = scale_up.decided_at - sent_at
        if scale_up.starting_at is not None:
            phases["replica_requested_s"] = scale_up.starting_at - scale_up.decided_at
            phases["worker_scheduling_s"] = process_started_at - scale_up.starting_at
        if scale_up.running_at is not None:
            phases["ready_to_running_s"] = scale_up.running_at - ready_at
            # Serve's long poll tells the router's handle, which sends the request on.
            phases["running_to_response_s"] = answered_at - scale_up.running_at
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in phases.items()}


def wait_for_zero(targets: list[ColdTarget], timeout_s: float, every_s: float = 0.2) -> float:
    """Wait until none of the targets has a replica in any state; returns the seconds waited."""
    started = time.monotonic()
    wait_until(
        lambda: all(sum(replica_states(t.app, t.deployment).values()) == 0 for t in targets),
        timeout_s,
        f"no replica of {[t.deployment for t in targets]}",
        every_s=every_s,
    )
    return time.monotonic() - started
