"""Upscale reaction: a chat deployment serving one stream gets a step of N more concurrent streams;
how long until the controller adds a replica, until it runs, and until it serves a stream."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from benchmarks.coldstart.cluster import replica_states
from benchmarks.coldstart.controller_log import ControllerLog, ScaleUp
from benchmarks.coldstart.probe import ColdTarget, WallClock
from deployments.contracts.chat_deployment import ChatClient, ChatRequest
from deployments.contracts.replies import Reply
from deployments.contracts.sampling_params import SamplingParams
from edgectl.local_cluster import wait_until

log = logging.getLogger(__name__)

MESSAGES = ({"role": "user", "content": "Tell me a long story about a train that runs late."},)


@dataclass
class ReplicaSightings:
    """Which replicas (told apart by when each became ready) have answered, and when first."""

    clock: WallClock
    first_reply_at: dict[float, float] = field(default_factory=dict)
    phases: dict[float, Any] = field(default_factory=dict)
    latest: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def saw(self, reply: Reply) -> None:
        with self._lock:
            ready_at = reply.replica_ready_at
            self.latest = ready_at
            if ready_at not in self.first_reply_at:
                self.first_reply_at[ready_at] = self.clock()
                self.phases[ready_at] = reply.phases.as_dict() if reply.phases else None

    def seen(self) -> frozenset[float]:
        with self._lock:
            return frozenset(self.first_reply_at)

    def first_new(self, known: frozenset[float]) -> tuple[float, float] | None:
        """(ready_at, first reply time) of a replica not in `known`, if one has answered."""
        with self._lock:
            new = [(at, first) for at, first in self.first_reply_at.items() if at not in known]
        return min(new, key=lambda item: item[1]) if new else None


async def _streams_until(
    handle: DeploymentHandle,
    sightings: ReplicaSightings,
    stop: asyncio.Event,
    max_tokens: int,
    seed: int,
) -> None:
    """One client: back-to-back chat streams until `stop`."""
    while not stop.is_set():
        params = SamplingParams(max_tokens=max_tokens, temperature=0.7, seed=seed)
        seed += 1
        stream = ChatClient(handle).stream(ChatRequest(list(MESSAGES), params))
        try:
            async for reply in stream:
                sightings.saw(reply)
                if stop.is_set():
                    break
        finally:
            stream.cancel()


async def _wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """wait_until in a thread: the streams this waits on keep running on the event loop."""
    return await asyncio.to_thread(wait_until, check, timeout_s, what, 0.1)


async def upscale_reactions(
    target: ColdTarget,
    controller: ControllerLog,
    step_streams: int,
    repetitions: int,
    max_tokens: int,
    timeout_s: float,
    wall_clock: WallClock = time.time,
) -> list[dict[str, Any]]:
    """One background stream keeps one replica up (and no more); each repetition adds
    `step_streams` streams at once and times the second replica, then takes them away and
    waits for the deployment to be back at one replica."""
    handle = serve.get_deployment_handle(target.deployment, app_name=target.app)
    sightings = ReplicaSightings(wall_clock)
    stop_background = asyncio.Event()
    background = asyncio.create_task(
        _streams_until(handle, sightings, stop_background, max_tokens, seed=0)
    )
    results = []
    try:
        for repetition in range(repetitions):
            await _wait_for(
                lambda: replica_states(target.app, target.deployment) == {"RUNNING": 1},
                timeout_s,
                f"{target.deployment} at exactly one running replica",
            )
            await _wait_for(lambda: sightings.latest is not None, timeout_s, "a reply")
            # Every replica that ever answered: the one left running is among them.
            known = sightings.seen()
            result = await _one_step(
                handle,
                target,
                controller,
                sightings,
                known,
                step_streams,
                max_tokens,
                timeout_s,
                wall_clock,
            )
            result["repetition"] = repetition
            log.info("upscale %s: %s", target.deployment, result)
            results.append(result)
    finally:
        stop_background.set()
        await background
    return results


async def _one_step(
    handle: DeploymentHandle,
    target: ColdTarget,
    controller: ControllerLog,
    sightings: ReplicaSightings,
    known: frozenset[float],
    step_streams: int,
    max_tokens: int,
    timeout_s: float,
    wall_clock: WallClock,
) -> dict[str, Any]:
    stop = asyncio.Event()
    step_at = wall_clock()
    clients = [
        asyncio.create_task(
            _streams_until(handle, sightings, stop, max_tokens, seed=1000 * (i + 1))
        )
        for i in range(step_streams)
    ]
    try:
        ready_at, served_at = await _wait_for(
            lambda: sightings.first_new(known), timeout_s, "a second replica to serve"
        )
    finally:
        stop.set()
        await asyncio.gather(*clients)
    scale_up = controller.scale_up(target.app, target.deployment, after=step_at)
    return reaction(step_at, scale_up, ready_at, served_at, sightings.phases.get(ready_at))


def reaction(
    step_at: float,
    scale_up: ScaleUp | None,
    ready_at: float,
    served_at: float,
    phases: dict[str, Any] | None,
) -> dict[str, Any]:
    """The step's timeline in seconds; the controller's part from its log (None without)."""

    def between(start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else round(end - start, 4)

    decided = None if scale_up is None else scale_up.decided_at
    requested = None if scale_up is None else scale_up.starting_at
    running = None if scale_up is None else scale_up.running_at
    return {
        "step_to_new_replica_serving_s": between(step_at, served_at),
        "step_to_decision_s": between(step_at, decided),
        "decision_to_requested_s": between(decided, requested),
        "requested_to_ready_s": between(requested, ready_at),
        "ready_to_running_s": between(ready_at, running),
        "running_to_first_reply_s": between(running, served_at),
        "new_replica_phases": phases,
    }


def run_upscale(
    target: ColdTarget,
    controller: ControllerLog,
    step_streams: int,
    repetitions: int,
    max_tokens: int,
    timeout_s: float,
) -> list[dict[str, Any]]:
    return asyncio.run(
        upscale_reactions(target, controller, step_streams, repetitions, max_tokens, timeout_s)
    )
