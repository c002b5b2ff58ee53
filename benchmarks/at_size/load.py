"""What one side is timed on, over HTTP with the same client and bodies on every side: single
streams (TTFT, one request at a time's tokens/s), a burst of concurrent whole answers (aggregate
tokens/s), and the decode stall: running streams' time between chunks while a long prompt is
prefilled, against the same streams' before it arrived."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from benchmarks.at_size.agreement import chat_tokenizer
from benchmarks.at_size.config import AtSizeBenchConfig
from benchmarks.lib.corpus import benchmark_sentences, chat_messages
from benchmarks.lib.goals import ratio
from benchmarks.lib.http_load import Endpoint, completion_tokens_at_once, timed_chat_stream
from edgectl.loadtest.summary import latency_stats_s

Clock = Callable[[], float]


def chat_body(
    model: str, seed: int, max_tokens: int, messages: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    # Sampled with a seed per request: no two bodies alike, so no cache answers for the model.
    return {
        "model": model,
        "messages": messages or chat_messages(),
        "max_tokens": max_tokens,
        "temperature": 0.7,
        "seed": seed,
    }


async def measure_side(
    config: AtSizeBenchConfig,
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    model: str,
    first_seed: int,
    clock: Clock,
) -> dict[str, Any]:
    """One run of one side: `ttft_streams` single streams, then `streams` requests at once."""
    singles = []
    for i in range(config.ttft_streams):
        await asyncio.sleep(config.settle_s)
        body = chat_body(model, first_seed + i, config.max_tokens)
        singles.append(await timed_chat_stream(client, endpoint.url, body, clock, endpoint.headers))
    await asyncio.sleep(config.settle_s)
    bodies = [
        chat_body(model, first_seed + 100 + i, config.max_tokens) for i in range(config.streams)
    ]
    wall_s, tokens = await completion_tokens_at_once(client, endpoint, bodies, clock)
    return {
        "ttft_p50_ms": round(statistics.median(t.ttft_s for t in singles) * 1000, 2),
        "one_at_a_time_tokens_per_s": round(statistics.median(t.tokens_per_s for t in singles), 2),
        "concurrent_tokens_per_s": round(tokens / wall_s, 2),
        "concurrent_tokens": tokens,
    }


def long_prompt(model_dir: Path, tokens: int) -> str:
    """English text of at least `tokens` tokens in the model's tokenizer."""
    tokenizer = chat_tokenizer(model_dir)
    sentences = benchmark_sentences(4 * tokens)  # more than enough: a sentence is several tokens
    text = ""
    for sentence in sentences:
        text = f"{text} {sentence}".strip()
        if len(tokenizer.encode_text(text)) >= tokens:
            return text
    raise ValueError(f"the corpus has fewer than {tokens} tokens")


async def decode_stall(
    config: AtSizeBenchConfig,
    client: httpx.AsyncClient,
    endpoint: Endpoint,
    model: str,
    prompt: str,
    first_seed: int,
    clock: Clock,
) -> dict[str, Any]:
    """`running_streams` streams; `lead_s` later a prompt of `prefill_tokens` arrives. Gaps
    between the streams' chunks that overlap its prefill (until its first token) against the
    gaps that ended before it was sent."""
    headers = endpoint.headers
    running = [
        asyncio.create_task(
            timed_chat_stream(
                client,
                endpoint.url,
                chat_body(model, first_seed + i, config.stream_tokens),
                clock,
                headers,
            )
        )
        for i in range(config.running_streams)
    ]
    await asyncio.sleep(config.lead_s)
    long_body = chat_body(model, first_seed - 1, 2, [{"role": "user", "content": prompt}])
    try:
        long = await timed_chat_stream(client, endpoint.url, long_body, clock, headers)
    finally:  # the running streams end (or fail) before the error goes on
        timings = await asyncio.gather(*running, return_exceptions=True)
    sent, prefilled = long.started_s, long.started_s + long.ttft_s
    before, during = [], []
    for timing in timings:
        if isinstance(timing, BaseException):
            raise timing
        times = [timing.started_s + at for at in timing.content_at_s]
        for start, end in zip(times, times[1:], strict=False):
            if end <= sent:
                before.append(end - start)
            elif start < prefilled:
                during.append(end - start)
    gaps_before, gaps_during = latency_stats_s(before), latency_stats_s(during)
    return {
        "prefill_ms": round(long.ttft_s * 1000, 2),
        "gaps_before_ms": gaps_before,
        "gaps_during_prefill_ms": gaps_during,
        "p99_during_over_median_before": ratio(gaps_during["p99"], gaps_before["p50"]),
    }
