"""The front-door suite's load, on one event loop until stopped: embedding and non-streaming chat
clients on pooled keep-alive connections (httpx, as the SDKs keep theirs), each sending its next
request when the last is answered; a probe opening a new connection on a fixed beat (a refused one
is seen as it happens); an admin client reading /admin. Every request is an Outcome."""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.front_door.config import FrontDoorBenchConfig
from benchmarks.front_door.windows import REFUSED, Kind, Outcome
from benchmarks.lib.corpus import benchmark_sentences, chat_messages
from benchmarks.lib.http_load import Clock, async_client

EMBEDDING = ("/v1/embeddings", "embedding")
CHAT = ("/v1/chat/completions", "glm")
PROBE_PATH = "/healthz"
# edge-control's view, the gateway state's keys, the dashboard's data (each of the three reads a
# different dependency: edge-control, the database, the routers' own traffic).
ADMIN_PATHS = ("/admin/regions", "/admin/keys", "/admin/dashboard-data")
PROBE_CONNECT_TIMEOUT_S = 2.0
SENTENCES = 64


@dataclass
class FrontDoorLoad:
    """Start with `run()` (a task); `stop()` ends every client after its request in flight."""

    base_url: str
    user_key: str
    admin_key: str
    config: FrontDoorBenchConfig
    clock: Clock
    outcomes: list[Outcome] = field(default_factory=list)
    _stopped: asyncio.Event = field(default_factory=asyncio.Event)
    _numbers: itertools.count[int] = field(default_factory=itertools.count)

    def stop(self) -> None:
        self._stopped.set()

    def last_bad_s(self) -> float | None:
        """When the latest failed request or refused connection was sent."""
        bad = (o.sent_s for o in reversed(self.outcomes) if o.failed or o.refused)
        return next(bad, None)

    async def run(self) -> None:
        config = self.config
        clients = config.embedding_clients + config.chat_clients
        pooled = async_client(max(clients, 1), config.request_timeout_s)
        admin = async_client(1, config.request_timeout_s)
        # No connection kept: each probe opens a new one.
        fresh = httpx.AsyncClient(
            limits=httpx.Limits(max_keepalive_connections=0),
            timeout=httpx.Timeout(config.request_timeout_s, connect=PROBE_CONNECT_TIMEOUT_S),
        )
        async with pooled, admin, fresh:
            loops = [self._client(pooled, "embedding") for _ in range(config.embedding_clients)]
            loops += [self._client(pooled, "chat") for _ in range(config.chat_clients)]
            await asyncio.gather(*loops, self._probe(fresh), self._admin(admin))

    async def _client(self, http: httpx.AsyncClient, kind: Kind) -> None:
        sentences = benchmark_sentences(SENTENCES)
        headers = {"authorization": f"Bearer {self.user_key}"}
        while not self._stopped.is_set():
            # Unique text: every request reaches a model, none is a cache hit.
            number = next(self._numbers)
            text = f"{sentences[number % SENTENCES]} ({number})"
            path, body = _request(kind, text, self.config.chat_max_tokens)
            post = functools.partial(http.post, self.base_url + path, json=body, headers=headers)
            outcome = await self._send(kind, post)
            if outcome.failed:
                await self._pause(self.config.error_backoff_s)

    async def _probe(self, http: httpx.AsyncClient) -> None:
        """A new connection every probe_interval_s, whether or not the last has been answered."""
        in_flight: set[asyncio.Task[Outcome]] = set()
        while not self._stopped.is_set():
            probe = functools.partial(http.get, self.base_url + PROBE_PATH)
            task = asyncio.create_task(self._send("probe", probe))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            await self._pause(self.config.probe_interval_s)
        await asyncio.gather(*in_flight)

    async def _admin(self, http: httpx.AsyncClient) -> None:
        headers = {"authorization": f"Bearer {self.admin_key}"}
        for path in itertools.cycle(ADMIN_PATHS):
            if self._stopped.is_set():
                return
            await self._send(
                "admin", functools.partial(http.get, self.base_url + path, headers=headers)
            )
            await self._pause(self.config.admin_interval_s)

    async def _send(self, kind: Kind, request: Callable[[], Awaitable[httpx.Response]]) -> Outcome:
        sent = self.clock()
        try:
            response = await request()
            await response.aread()
            outcome = Outcome(kind, sent, self.clock(), response.status_code)
        except httpx.ConnectError:
            outcome = Outcome(kind, sent, self.clock(), None, REFUSED)
        except httpx.TransportError as error:  # closed mid-answer, timed out: no answer
            outcome = Outcome(kind, sent, self.clock(), None, type(error).__name__)
        self.outcomes.append(outcome)
        return outcome

    async def _pause(self, seconds: float) -> None:
        """Sleep `seconds`, or less if the load is stopped meanwhile."""
        try:
            await asyncio.wait_for(self._stopped.wait(), seconds)
        except TimeoutError:
            return


def _request(kind: Kind, text: str, max_tokens: int) -> tuple[str, Mapping[str, Any]]:
    if kind == "embedding":
        path, model = EMBEDDING
        return path, {"model": model, "input": text}
    path, model = CHAT
    messages = chat_messages()
    messages[-1]["content"] = f"{messages[-1]['content']} {text}"
    return path, {"model": model, "messages": messages, "max_tokens": max_tokens}
