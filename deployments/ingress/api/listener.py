"""The router replicas' own HTTP listener (`router.listener`, off by default; the shipped front is
HAProxy on http_options.port, docs/operating.md "The front door"): a client connected to it
reaches a router replica directly, without Ray Serve's Python proxy in between, so a request
crosses one Python process fewer than through that proxy (docs/performance.md).

Every router replica of a node binds the same port with SO_REUSEPORT, and the kernel spreads new
connections over them; a replica that dies leaves the group with its socket. Serve's front keeps
serving `http_options.port` beside it, with Serve's own health checks and placement; this port
has neither, and any process of the same user binding it with SO_REUSEPORT joins the group (a
second cluster on the host must use another port).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from deployments.config import ListenerConfig

log = logging.getLogger("ray.serve")

# Connections already accepted get this long to finish when the replica shuts down.
GRACEFUL_SHUTDOWN_S = 30


def shared_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port) that other sockets with SO_REUSEPORT may share."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class _ReplicaServer(uvicorn.Server):
    """uvicorn without its signal handlers: the replica's signals are Ray's to handle."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class RouterListener:
    """`app` served on the configured port from the replica's own event loop."""

    def __init__(self, app: FastAPI, config: ListenerConfig):
        self._config = config
        # lifespan off: Ray Serve already runs the app's lifespan for this replica. log_config
        # None: uvicorn's own would go through logging.config.dictConfig, which closes every
        # handler of the process (the replica's logs, our access log file).
        self._server = _ReplicaServer(
            uvicorn.Config(
                app,
                lifespan="off",
                access_log=False,
                log_config=None,
                log_level="warning",
                timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            )
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> bool:
        """Bind now and serve; False, said loudly, when the port is held by a socket that does
        not share it: the replica still serves behind Serve's proxy."""
        where = f"{self._config.host}:{self._config.port}"
        try:
            sock = shared_port_socket(self._config.host, self._config.port)
        except OSError as exc:
            log.error(
                "router listener: cannot bind %s (%s); serving through Serve's proxy only "
                "(router.listener in serve_config.yaml)",
                where,
                exc,
            )
            return False
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        log.info("router listener on %s", where)
        return True

    async def stop(self) -> None:
        """Stop accepting, let the requests in flight finish (up to GRACEFUL_SHUTDOWN_S)."""
        if self._task is None:
            return
        self._server.should_exit = True
        await self._task
        self._task = None
