"""Chat, ours vs `generate()` per request on the same tiny GLM: aggregate tokens/s of concurrent
requests in alternating rounds; TTFT of one stream and the router hop it is judged against."""

from __future__ import annotations

import asyncio
import logging
import statistics
from typing import Any

from ray import serve

from benchmarks.http_load import (
    Endpoint,
    async_client,
    latency_summary,
    timed_chat_stream,
    timed_post,
)
from benchmarks.models import CHAT_PROMPT
from benchmarks.peers.common import PEER_CHAT, Clock, post_json, ratio, ready, rotated
from benchmarks.peers.config import PeersBenchConfig
from benchmarks.router import BYPASS_CACHE

log = logging.getLogger(__name__)


async def bench_chat(config: PeersBenchConfig, base_url: str, clock: Clock) -> dict[str, Any]:
    result: dict[str, Any] = {"max_tokens": config.chat_max_tokens, "streams": config.chat_streams}
    result["same_model"] = await _same_model_check(config)
    urls = {
        "ours": f"{base_url}/v1/chat/completions",
        "generate_per_request": f"{base_url}{PEER_CHAT[1]}",
    }

    def body(seed: int) -> dict[str, Any]:
        return {
            "model": "glm",
            "messages": list(CHAT_PROMPT),
            "max_tokens": config.chat_max_tokens,
            "temperature": 0.7,
            "seed": seed,
        }

    async with async_client(config.chat_streams) as client:
        for url in urls.values():
            await ready(client, Endpoint(url, BYPASS_CACHE), body(0))

        async def burst(url: str, first_seed: int) -> tuple[float, int]:
            started = clock()
            answers = await asyncio.gather(
                *(post_json(client, url, body(first_seed + i)) for i in range(config.chat_streams))
            )
            return clock() - started, sum(a["usage"]["completion_tokens"] for a in answers)

        rates: dict[str, list[float]] = {name: [] for name in urls}
        for round_index in range(config.rounds):
            for name in rotated(list(urls), round_index):
                wall_s, tokens = await burst(urls[name], 100 * round_index)
                rates[name].append(round(tokens / wall_s, 2))
                log.info("chat %s: %d tokens in %.2fs", name, tokens, wall_s)
        result["aggregate_tokens_per_s"] = {
            name: {"median": round(statistics.median(r), 2), "rounds": r}
            for name, r in rates.items()
        }
        result["ratio_vs_generate_per_request"] = ratio(
            result["aggregate_tokens_per_s"]["ours"]["median"],
            result["aggregate_tokens_per_s"]["generate_per_request"]["median"],
        )
        # TTFT of one stream vs what it cannot avoid: one decode step and the router hop. The hop
        # is a moderation request through the router (a tiny model behind the same handle path).
        ttfts = []
        for seed in range(config.ttft_runs):
            timing = await timed_chat_stream(client, urls["ours"], body(seed), clock)
            ttfts.append(timing.ttft_s)
        hop = Endpoint(f"{base_url}/v1/moderations", BYPASS_CACHE)
        hops = [
            await timed_post(client, hop, {"input": "hello there"}, clock)
            for _ in range(config.ttft_runs * 3)
        ]
    result["ttft"] = latency_summary(ttfts)
    result["router_hop"] = latency_summary(hops)
    return result


async def _same_model_check(config: PeersBenchConfig) -> dict[str, Any]:
    """Greedy tokens from the peer's PyTorch model and from our ONNX graph must match."""
    from deployments.runtime.llm import LLMRuntime

    runtime = LLMRuntime(config.models_dir / "glm")
    try:
        prompt = runtime.tokenizer.encode_chat(list(CHAT_PROMPT))
        ours = runtime.graph.greedy_cached(prompt, 8)
    finally:
        runtime.close()
    handle = serve.get_deployment_handle(PEER_CHAT[2], app_name=PEER_CHAT[0])
    theirs = await handle.greedy.remote(prompt, 8)
    return {"greedy_tokens_equal": ours == theirs, "ours": ours, "peer": theirs}
