"""The router's own HTTP listener (deployments/ingress/api/listener.py), on a small app, without
Ray."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

import httpx
import pytest
from fastapi import FastAPI

from deployments.config import ListenerConfig
from deployments.ingress.api.listener import RouterListener, shared_port_socket
from edgectl.local_cluster import free_port
from tests.waiting import until


def _app(
    name: str, release: asyncio.Event | None = None, arrived: asyncio.Event | None = None
) -> FastAPI:
    app = FastAPI()

    @app.get("/who")
    async def who() -> dict[str, str]:
        return {"name": name, "pid": str(os.getpid())}

    @app.get("/slow")
    async def slow() -> dict[str, str]:
        assert release is not None
        if arrived is not None:
            arrived.set()
        await release.wait()
        return {"name": name}

    return app


def test_listeners_share_one_port_and_each_serves():
    async def main() -> set[str]:
        config = ListenerConfig(enabled=True, host="127.0.0.1", port=free_port())
        listeners = [RouterListener(_app(name), config) for name in ("a", "b")]
        for listener in listeners:
            listener.start()
        seen: set[str] = set()
        try:
            for _ in range(64):  # a new connection each time: the kernel picks a socket
                async with httpx.AsyncClient() as client:
                    answer = await client.get(f"http://127.0.0.1:{config.port}/who")
                seen.add(answer.json()["name"])
                if seen == {"a", "b"}:
                    break
        finally:
            for listener in listeners:
                await listener.stop()
        return seen

    assert asyncio.run(main()) == {"a", "b"}


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def test_stop_lets_a_request_in_flight_finish_and_refuses_new_connections():
    async def main() -> tuple[int, str]:
        release, arrived = asyncio.Event(), asyncio.Event()
        config = ListenerConfig(enabled=True, host="127.0.0.1", port=free_port())
        listener = RouterListener(_app("a", release, arrived), config)
        listener.start()
        async with httpx.AsyncClient() as client:
            in_flight = asyncio.create_task(client.get(f"http://127.0.0.1:{config.port}/slow"))
            await asyncio.wait_for(arrived.wait(), 30)
            stopping = asyncio.create_task(listener.stop())
            await until(lambda: refused(config.port), 30, "the listener to stop accepting")
            assert not stopping.done()  # waits for the request in flight
            release.set()
            answer = await in_flight
            await stopping
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient() as client:
                await client.get(f"http://127.0.0.1:{config.port}/who")
        return answer.status_code, answer.json()["name"]

    assert asyncio.run(main()) == (200, "a")


def test_a_port_held_without_sharing_is_refused_and_said(caplog: pytest.LogCaptureFixture):
    plain = socket.socket()
    plain.bind(("127.0.0.1", 0))
    plain.listen()
    port = plain.getsockname()[1]
    try:
        with pytest.raises(OSError):
            shared_port_socket("127.0.0.1", port)

        async def start() -> bool:
            config = ListenerConfig(enabled=True, host="127.0.0.1", port=port)
            return RouterListener(_app("a"), config).start()

        with caplog.at_level("ERROR", logger="ray.serve"):
            assert asyncio.run(start()) is False
        assert f"cannot bind 127.0.0.1:{port}" in caplog.text
    finally:
        plain.close()


def test_the_replicas_log_handlers_stay_open():
    closed: list[str] = []

    class Recording(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            pass

        def close(self) -> None:
            closed.append("closed")
            super().close()

    handler = Recording()
    logging.getLogger("edge.test.listener").addHandler(handler)
    try:
        RouterListener(_app("a"), ListenerConfig(enabled=True, port=free_port()))
        assert closed == []
    finally:
        logging.getLogger("edge.test.listener").removeHandler(handler)


def test_the_listener_is_off_unless_asked():
    assert ListenerConfig().enabled is False
    with pytest.raises(ValueError, match="port"):
        ListenerConfig(port=0)
