"""`front-spare`: a second HAProxy on the port Serve's HAProxy serves, so the front door outlives
the death of either.

Serve runs one HAProxy per proxy node (`serve run`: one in all) and restarts a dead one only when
its proxy actor has failed 3 health checks and been replaced: 4.5 s of refused connections with
checks every 1 s (docs/performance.md). With `SO_REUSEPORT` (`SERVE_SOCKET_REUSE_PORT_ENABLED=1`
in serve_config.yaml) two processes listen on one port, each with its own queue of connections,
and the kernel hands each new connection to one of them; when one dies its listening socket goes
with it and every new connection goes to the other.

`SpareFront` keeps that other process: a copy of Serve's own config for the node it runs on
(deployments.ray_ext.haproxy_front: the same frontends, backends and health checks, without what
belongs to Serve's one process), started, followed when Serve rewrites the config (a graceful
`-sf` reload, as Serve does its own) once Serve's HAProxy has its routes and router replicas (a
restarted one first writes a config that has neither), and restarted at its next check when it
died. A start that failed (HAProxy exited with an error: a bad config, a port not shared) is
retried when Serve's config changes, or after `failed_start_backoff_s`. With no HAProxy config
on the node (Serve's Python proxy, or no proxy there) there is nothing to spare. The spare dies
with the thread that started it (`PR_SET_PDEATHSIG`): a replica killed leaves no HAProxy behind,
and Serve starts a new replica, which starts a new spare; Serve's HAProxy serves meanwhile.

`FrontSpare` is the Serve deployment (one replica, no CPU, on the head node: where a `HeadOnly`
Serve has its proxy); its checks run in a thread (a process's start and the file reads block).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from deployments.config.front_spare import FrontSpareConfig
from deployments.ray_ext.haproxy_front import (
    haproxy_binary,
    read_serve_config,
    ready_for_traffic,
    serve_config_path,
    spare_config,
)

logger = logging.getLogger("ray.serve")

SPARE_DIR = "edge-front-spare"  # beside Serve's HAProxy files of the node
STOP_GRACE_S = 5.0  # a stopped spare finishes its requests in flight this long, at most
_PR_SET_PDEATHSIG = 1
_STDERR_TAIL_BYTES = 2000


class SpareProcess(Protocol):
    """What `SpareFront` uses of a started process (`subprocess.Popen`)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def send_signal(self, sig: int) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


Launch = Callable[[Sequence[str], Path], SpareProcess]


class SpareFront:
    """The spare HAProxy of one node: `check()` once per interval, from one thread."""

    def __init__(
        self,
        source: Path,
        workdir: Path,
        binary: str,
        config: FrontSpareConfig,
        launch: Launch | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source  # Serve's HAProxy config on this node
        self.workdir = workdir
        self.binary = binary
        self.config = config
        self._launch = launch or launch_with_parent
        self._clock = clock
        self._process: SpareProcess | None = None
        self._serving: str | None = None  # Serve's config text the running spare was made from
        self._draining: list[SpareProcess] = []  # replaced by a reload, finishing their requests
        self._failed: str | None = None  # Serve's config text of the last failed start
        self._retry_at = 0.0
        self.starts = 0
        self.failed_starts = 0
        self.last_error: str | None = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def check(self) -> None:
        """Start, reload, restart or stop the spare as Serve's config and the process say."""
        self._draining = [p for p in self._draining if p.poll() is None]
        wanted = read_serve_config(self.source)
        if wanted is None:  # no HAProxy of Serve's on this node (now)
            self._stop_current()
            return
        if not ready_for_traffic(wanted) and self.running:
            return  # Serve's HAProxy restarting without its routes yet: keep the good config
        self._note_exit()
        if self.running and wanted == self._serving:
            return
        if not self.running and wanted == self._failed and self._clock() < self._retry_at:
            return
        self._start(wanted)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every spare process: softly (requests in flight finish), then at `grace_s`."""
        self._stop_current()
        deadline = self._clock() + grace_s
        for process in self._draining:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - self._clock()))
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        self._draining = [p for p in self._draining if p.poll() is None]

    def describe(self) -> dict[str, Any]:
        process = self._process  # one read: the checking thread may replace it meanwhile
        running = process is not None and process.poll() is None
        return {
            "running": running,
            "pid": process.pid if running and process is not None else None,
            # Older spares still alive: finishing their requests after a reload, or, after a
            # replacement HAProxy refused to start, still listening with the config before.
            "older_alive": sum(1 for p in list(self._draining) if p.poll() is None),
            "serve_config": str(self.source),
            "starts": self.starts,
            "failed_starts": self.failed_starts,
            "last_error": self.last_error,
        }

    def _note_exit(self) -> None:
        """A spare that exited: killed (restarted now) or failed at its start (backed off)."""
        if self._process is None or self._process.poll() is None:
            return
        code = self._process.poll()
        if code is not None and code > 0:  # HAProxy's own exit: a config or a bind it refused
            self.failed_starts += 1
            self._failed = self._serving
            self._retry_at = self._clock() + self.config.failed_start_backoff_s
            self.last_error = f"HAProxy exited with {code}: {self._stderr_tail()}"
            logger.warning("front spare: %s", self.last_error)
        else:
            logger.warning("front spare: HAProxy (pid %d) ended (%s)", self._process.pid, code)
        self._process = None
        self._serving = None

    def _start(self, wanted: str) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "haproxy.cfg"
        config_path.write_text(spare_config(wanted), encoding="utf-8")
        args = [self.binary, "-db", "-f", str(config_path)]
        replaced = [
            p for p in (self._process, *self._draining) if p is not None and p.poll() is None
        ]
        if replaced:  # graceful: the new one tells these to stop listening once it listens
            args += ["-sf", *(str(p.pid) for p in replaced)]
        self._process = self._launch(args, self.workdir / "haproxy.stderr.log")
        self._draining = replaced
        self._serving = wanted
        self.starts += 1
        logger.info("front spare: HAProxy started (pid %d): %s", self._process.pid, args)

    def _stop_current(self) -> None:
        if self.running and self._process is not None:
            self._process.send_signal(signal.SIGUSR1)  # HAProxy's soft stop
            self._draining.append(self._process)
        self._process = None
        self._serving = None

    def _stderr_tail(self) -> str:
        try:
            with (self.workdir / "haproxy.stderr.log").open("rb") as err:
                err.seek(0, 2)
                err.seek(max(0, err.tell() - _STDERR_TAIL_BYTES))
                return err.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""


def launch_with_parent(args: Sequence[str], stderr_path: Path) -> SpareProcess:
    """`args` started with its stderr in `stderr_path`, to be sent SIGTERM by the kernel when
    the thread that started it ends (`PR_SET_PDEATHSIG`): never an HAProxy outliving its
    replica on the port."""
    libc = ctypes.CDLL(None, use_errno=True)

    def die_with_parent() -> None:  # in the child, before exec: no Python objects shared
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    with stderr_path.open("wb") as stderr:
        return subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            preexec_fn=die_with_parent,  # noqa: PLW1509 - one libc call, nothing that locks
        )


class FrontSpare:
    """The Ray Serve deployment (one replica, no CPU, on the head node)."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        import ray

        self.config = FrontSpareConfig.model_validate(config or {})
        source = serve_config_path(ray.get_runtime_context().get_node_id())
        self.front = SpareFront(source, source.parent / SPARE_DIR, haproxy_binary(), self.config)
        self._stopping = threading.Event()
        # The thread that starts the spare is the one whose end the spare dies with: it lives
        # as long as this replica.
        self._thread = threading.Thread(target=self._run, name="front-spare", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self.front.check()
            except Exception:  # noqa: BLE001 - a file or process hiccup: tried again next check
                logger.warning("front spare: check failed", exc_info=True)
            self._stopping.wait(self.config.check_interval_s)
        self.front.stop()

    async def describe(self) -> dict[str, Any]:
        return self.front.describe()  # read while the thread may check: each field is one read

    async def check_health(self) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the front spare's thread died")

    def __del__(self) -> None:
        # Serve's graceful shutdown of the replica (a redeploy, `serve shutdown`): the thread
        # stops the spare softly; the kernel ends what is left when the process exits.
        self._stopping.set()
        self._thread.join(timeout=STOP_GRACE_S + 1.0)
