"""What one arrival sends: endpoint, JSON body and headers, for both the OpenAI and the
Workers-AI API of each task."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from edge_sim.geo import GEO_HEADER
from edgectl.loadtest.scenarios import Arrival, Task

CACHE_HEADER = "x-edge-cache"

# Mixed languages and lengths: the chat models are Chinese models, and tokenisation cost differs.
PROMPTS: Mapping[Task, tuple[str, ...]] = MappingProxyType(
    {
        "chat": (
            "Explain in two sentences why edge inference lowers latency.",
            "用一句话介绍长城。",
            "Write a haiku about a cold start.",
            "List three uses of text embeddings.",
            "请把这句话翻译成英文：今天天气很好。",
            "What is the capital of Australia? Answer briefly.",
        ),
        "embedding": (
            "Ray Serve scales each model deployment independently.",
            "边缘计算让推理更靠近用户。",
            "The quick brown fox jumps over the lazy dog.",
            "Scale to zero saves money when nobody calls the model.",
        ),
        "moderation": (
            "Have a wonderful day, friend!",
            "This is a perfectly polite sentence about the weather.",
            "You are a useless idiot.",
            "What time does the museum open on Sundays?",
        ),
    }
)


@dataclass(frozen=True, slots=True)
class WorkloadSettings:
    max_tokens: int = 32  # chat answers; short so a run measures serving, not generation length
    stream: bool = True  # chat requests stream (SSE), so TTFT and token counts are measured
    # Of those, the share that streams; the rest ask for whole answers (chosen by the seeded
    # prompt draw, so a schedule always splits the same way).
    stream_share: float = 1.0
    api_key: str | None = None  # sent as a bearer token when the router asks for one
    # The router caches deterministic answers (embeddings, moderations); a load test of the
    # models bypasses it, "allow" measures the cache too (x-edge-cache: HIT in the records).
    cache: Literal["bypass", "allow"] = "bypass"


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    stream: bool

    @property
    def endpoint(self) -> str:
        """The route, without the model name of /ai/run/{model}: groups requests in reports."""
        return "/ai/run/{model}" if self.path.startswith("/ai/run/") else self.path


def build_request(arrival: Arrival, settings: WorkloadSettings, run_id: str) -> HttpRequest:
    task, name = arrival.model.task, arrival.model.name
    prompts = PROMPTS[task]
    text = prompts[arrival.prompt % len(prompts)]
    # Ray Serve echoes a client's x-request-id, so a slow request can be found in the logs.
    headers = {GEO_HEADER: arrival.region.geo_header, "x-request-id": f"{run_id}-{arrival.seq}"}
    if settings.api_key:
        headers["authorization"] = f"Bearer {settings.api_key}"
    if settings.cache == "bypass":
        headers[CACHE_HEADER] = "bypass"
    streams = (arrival.prompt // 256) % 100 < settings.stream_share * 100  # apart from the text
    stream = task == "chat" and settings.stream and streams
    if arrival.api == "workers":
        body: dict[str, Any] = {"text": text}
        if task == "chat":
            body = {"prompt": text, "max_tokens": settings.max_tokens, "stream": stream}
        return HttpRequest("POST", f"/ai/run/{name}", body, headers, stream)
    if task == "chat":
        body = {
            "model": name,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": settings.max_tokens,
            "stream": stream,
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
        return HttpRequest("POST", "/v1/chat/completions", body, headers, stream)
    path = "/v1/embeddings" if task == "embedding" else "/v1/moderations"
    return HttpRequest("POST", path, {"model": name, "input": text}, headers, stream)
