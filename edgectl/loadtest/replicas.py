"""Replica counts per deployment over a run, sampled from Ray Serve's own status in a background
thread (the event loop that sends requests never waits on the Ray dashboard)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from edge_sim.clock import Clock
from edgectl.serve_state import ApplicationState, ServeStatusError

StatusReader = Callable[[], ApplicationState]
MAX_KEPT_ERRORS = 5


@dataclass(frozen=True, slots=True)
class ReplicaSample:
    t_s: float  # seconds since the run started (middle of the status call)
    deployment: str
    running: int
    wanted: int  # running + starting: the controller's target once it has acted
    status: str


class ReplicaSampler:
    """Calls `read_status` every `every_s` seconds until stopped; keeps every sample."""

    def __init__(
        self,
        read_status: StatusReader,
        *,
        every_s: float = 2.0,
        deployments: Collection[str] | None = None,
        clock: Clock = time.monotonic,
    ):
        if every_s <= 0:
            raise ValueError("every_s must be positive")
        self._read_status = read_status
        self._every_s = every_s
        self._deployments = None if deployments is None else frozenset(deployments)
        self._clock = clock
        self._lock = threading.Lock()
        self._samples: list[ReplicaSample] = []
        self._errors: list[str] = []
        self._error_count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    @property
    def samples(self) -> list[ReplicaSample]:
        with self._lock:
            return list(self._samples)

    @property
    def error_count(self) -> int:
        with self._lock:
            return self._error_count

    @property
    def recent_errors(self) -> list[str]:
        with self._lock:
            return list(self._errors)

    def sample_once(self) -> None:
        """Take one sample now (the thread's loop body; tests call it directly)."""
        started = self._clock()
        try:
            state = self._read_status()
        except ServeStatusError as error:
            with self._lock:
                self._error_count += 1
                self._errors = [*self._errors, str(error)][-MAX_KEPT_ERRORS:]
            return
        at_s = (started + self._clock()) / 2 - self._t0
        taken = [
            ReplicaSample(at_s, name, deployment.running, deployment.wanted, deployment.status)
            for name, deployment in sorted(state.deployments.items())
            if self._wanted(name)
        ]
        with self._lock:
            self._samples.extend(taken)

    def _wanted(self, name: str) -> bool:
        """A model's deployment: named after it, or `<model>-<region>` with regions."""
        if self._deployments is None:
            return True
        return name in self._deployments or name.rpartition("-")[0] in self._deployments

    def start(self, t0: float) -> None:
        """Sample now and then every `every_s` seconds; times are relative to `t0`."""
        if self._thread is not None:
            raise RuntimeError("the sampler is already running")
        self._t0 = t0
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="replica-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None

    @contextmanager
    def running(self, t0: float) -> Iterator[ReplicaSampler]:
        self.start(t0)
        try:
            yield self
        finally:
            self.stop()

    def _loop(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self._every_s):
                return
