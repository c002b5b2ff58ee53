"""The gateway suite: `serve run` of a temp copy of serve_config.yaml (HAProxy in front on its HTTP
port, two API keys, one model's idle delay cut), then issue 44's live goals measured through that
door: single flight of identical requests, fairness between keys, Retry-After against a model's
real readiness, and the router's own overhead. Each part's figures, or its error, in the report;
every goal judged by verdicts.py."""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml

from benchmarks.atrest.serve_files import model_deployments
from benchmarks.atrest.serve_run import ServeRun, serve_run
from benchmarks.gateway import fairness, overhead, retry_after, single_flight
from benchmarks.gateway.config import GatewayBenchConfig
from benchmarks.gateway.metrics import model_calls
from benchmarks.gateway.serve_files import (
    FLOOD_KEY,
    LIGHT_KEY,
    cluster_env,
    gateway_config,
)
from benchmarks.gateway.verdicts import goals
from benchmarks.lib.corpus import chat_messages
from benchmarks.lib.http_load import Endpoint, async_client, ready
from edgectl.local_cluster import free_port

log = logging.getLogger(__name__)

NEEDS_RAY = True
EMBEDDING_MODEL = "embedding"
CONNECTIONS = 128  # the flood and the pollers: none waits for a socket (B has its own client)
BYPASS = {"x-edge-cache": "bypass"}  # a request that must reach a model every time
Part = Callable[[], Awaitable[dict[str, Any]]]


def run(args: argparse.Namespace) -> dict[str, Any]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # thousands of requests
    return run_gateway_suite(GatewayBenchConfig.from_args(args))


def run_gateway_suite(config: GatewayBenchConfig) -> dict[str, Any]:
    shipped = yaml.safe_load(config.serve_config.read_text())
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        root = Path(tmp)
        http_port = free_port()
        serve_config = gateway_config(
            shipped,
            config.models_dir,
            root / "data",
            http_port,
            free_port(),
            config.retry_model,
            config.idle_delay_s,
        )
        workdir = root / "serve"
        workdir.mkdir()
        started = time.monotonic()
        with serve_run(
            serve_config, workdir, config.ray_num_cpus, config.start_timeout_s, cluster_env()
        ) as served:
            running_s = round(time.monotonic() - started, 1)
            base_url = f"http://127.0.0.1:{http_port}"
            figures = asyncio.run(measure(config, served, serve_config, base_url))
    return {
        "config": config.model_dump(mode="json"),
        "running_after_s": running_s,
        **figures,
        "goals": goals(figures),
    }


async def measure(
    config: GatewayBenchConfig,
    served: ServeRun,
    serve_config: Mapping[str, Any],
    base_url: str,
) -> dict[str, Any]:
    async with async_client(CONNECTIONS) as client:
        return await Gateway(config, served, serve_config, base_url, client).measure()


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


class Gateway:
    """The parts, in an order that lets Ray export the chat replicas' counter between the
    single flight burst's two readings without waiting idle: the embedding and Retry-After
    parts touch other models."""

    def __init__(
        self,
        config: GatewayBenchConfig,
        served: ServeRun,
        serve_config: Mapping[str, Any],
        base_url: str,
        client: httpx.AsyncClient,
    ):
        self.config = config
        self.client = client
        self.served = served
        self.base_url = base_url
        self.metrics_url = f"http://127.0.0.1:{served.cluster.metrics_port}/metrics"
        (app,) = serve_config["applications"]
        self.app = app["name"]
        self.retry_pools = [d["name"] for d in model_deployments(serve_config, config.retry_model)]
        self.run_id = secrets.token_hex(4)  # nothing this run sends is in a cache already
        self.clock = time.perf_counter
        self.chat_touched = 0.0  # monotonic time of the chat model's latest request

    async def measure(self) -> dict[str, Any]:
        figures: dict[str, Any] = {}
        await self._ready()
        figures["overhead"] = await _part("overhead", self._overhead)
        calls_before = await self._chat_calls_settled()
        burst = await _part("single_flight", self._burst)
        figures["retry_after"] = await _part("retry_after", self._retry_after)
        if "error" not in burst:
            calls_after = await self._chat_calls_settled()
            counted = None
            if calls_before is not None and calls_after is not None:
                counted = calls_after - calls_before
            burst = single_flight.summarise_bursts(burst.pop("bursts"), counted)
        figures["single_flight"] = burst
        figures["fairness"] = await _part("fairness", self._fairness)
        return figures

    def _url(self, path: str) -> str:
        return f"{self.base_url}{path}"

    async def _ready(self) -> None:
        """Until HAProxy, the routers, the embedder and the chat model answer the flood key."""
        headers = auth(FLOOD_KEY)
        embedding = Endpoint(self._url("/v1/embeddings"), headers)
        await ready(self.client, embedding, {"model": EMBEDDING_MODEL, "input": "ready?"})
        chat = Endpoint(self._url("/v1/chat/completions"), {**headers, **BYPASS})
        await ready(self.client, chat, self._chat_body(4, temperature=0))
        self.chat_touched = time.monotonic()

    def _chat_body(self, max_tokens: int, **fields: Any) -> dict[str, Any]:
        return {
            "model": self.config.chat_model,
            "messages": chat_messages(),
            "max_tokens": max_tokens,
            **fields,
        }

    async def _overhead(self) -> dict[str, Any]:
        config = self.config
        texts = overhead.inputs(config.overhead_warmup + config.overhead_requests, self.run_id)
        url, headers = self._url("/v1/embeddings"), auth(FLOOD_KEY)
        warmup, timed = texts[: config.overhead_warmup], texts[config.overhead_warmup :]
        await overhead.one_by_one(self.client, url, headers, EMBEDDING_MODEL, warmup, self.clock)
        values, latencies = await overhead.one_by_one(
            self.client, url, headers, EMBEDDING_MODEL, timed, self.clock
        )
        summary = overhead.summarise(values, latencies)
        log.info("overhead: x-edge-overhead-ms %s", summary["overhead_ms"])
        return summary

    async def _chat_calls_settled(self) -> float | None:
        """The chat replicas' call count once Ray has exported their latest calls."""
        wait_s = self.chat_touched + self.config.metrics_settle_s - time.monotonic()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        return await model_calls(self.client, self.metrics_url, self.config.chat_model)

    async def _burst(self) -> dict[str, Any]:
        """The bursts of identical requests, each asking something of its own; summarised once
        the replicas' counter can be read."""
        bursts = []
        for index in range(self.config.identical_bursts):
            question = f"Name three rivers ({self.run_id}, burst {index})."
            body = {
                "model": self.config.chat_model,
                "messages": [{"role": "user", "content": question}],
                "max_tokens": self.config.identical_max_tokens,
                "temperature": 0,
            }
            answers = await single_flight.identical_at_once(
                self._url("/v1/chat/completions"),
                auth(FLOOD_KEY),
                body,
                self.config.identical_requests,
                self.clock,
                warm_url=self._url("/v1/models"),
            )
            summary = single_flight.summarise(answers)
            log.info(
                "single flight, burst %d: %s, waiters p50 past the first %s ms",
                index,
                summary["cache"],
                summary["waiters_p50_over_first_ms"],
            )
            bursts.append(answers)
        self.chat_touched = time.monotonic()
        return {"bursts": bursts}

    async def _retry_after(self) -> dict[str, Any]:
        config = self.config
        caller = retry_after.BusyCaller(
            self._url(f"/ai/run/{config.retry_model}"),
            {**auth(LIGHT_KEY), **BYPASS},
            {
                "messages": chat_messages(),
                "max_tokens": 4,
                "options": {"rejectIfBusy": True},
            },
        )
        tries = []
        for index, kind in enumerate(retry_after.kinds(config.retry_tries, config.ready_polls)):
            one = await retry_after.one_try(
                self.client,
                caller,
                kind,
                self._retry_model_at_zero,
                config.poll_interval_s,
                config.ready_timeout_s,
                self.clock,
            )
            log.info("retry-after try %d (%s): %s", index + 1, kind, one)
            tries.append(one)
        return retry_after.summarise(tries)

    async def _retry_model_at_zero(self) -> float | None:
        """Seconds until Serve shows no replica of the retry model in any region (None: still
        some after its idle delay and zero_timeout_s), then zero_settle_s for the routers."""
        started = time.monotonic()
        deadline = started + self.config.idle_delay_s + self.config.zero_timeout_s
        pools = {self.app: self.retry_pools}
        while await asyncio.to_thread(self.served.replicas_up, pools):
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.5)
        to_zero_s = round(time.monotonic() - started, 2)
        await asyncio.sleep(self.config.zero_settle_s)
        return to_zero_s

    async def _fairness(self) -> dict[str, Any]:
        config = self.config
        url = self._url("/v1/chat/completions")
        light = fairness.Caller(
            url,
            {**auth(LIGHT_KEY), **BYPASS},
            self._chat_body(config.light_max_tokens, temperature=0),
        )
        flood = fairness.Caller(
            url,
            {**auth(FLOOD_KEY), **BYPASS},
            self._chat_body(config.flood_max_tokens, temperature=0),
        )
        alone = await fairness.one_at_a_time_apart(
            light, config.light_alone_streams, config.light_gap_s
        )
        flooded, lightly = await fairness.flood_beside(
            self.client,
            flood,
            config.flood_streams,
            config.flood_ramp_s,
            light,
            config.light_streams,
            config.light_gap_s,
            self.clock,
        )
        summary = {
            "light_alone": fairness.summarise(alone),
            "light": fairness.summarise(lightly),
            "flood": fairness.summarise(flooded),
        }
        log.info(
            "fairness: B alone p99 %s ms, B p99 %s ms, A p50 %s ms",
            summary["light_alone"]["ttft_ms"]["p99"],
            summary["light"]["ttft_ms"]["p99"],
            summary["flood"]["ttft_ms"]["p50"],
        )
        return summary


async def _part(name: str, part: Part) -> dict[str, Any]:
    """A part's figures, or its error: one part that breaks leaves the others measured."""
    log.info("gateway: %s", name)
    try:
        return await part()
    except Exception as error:  # noqa: BLE001 - reported in the JSON as the part's miss
        log.exception("gateway part %s failed", name)
        return {"error": f"{type(error).__name__}: {error}"}
