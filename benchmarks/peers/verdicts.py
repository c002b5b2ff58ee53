"""Issue 14's goals, judged from the suite's results: each ratio next to its target, and a figure
that could not be computed is a miss that says so."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks.peers.common import ratio

# Goals, each a ratio of numbers measured side by side in one run.
EMBEDDING_32_TARGET = 1.5  # our requests/s over the docs pattern's at 32 clients, at least
EMBEDDING_1_TARGET = 1.0  # the same at 1 client
CHAT_PEER_TARGET = 4.0  # aggregate tokens/s at 16 streams, ours over generate() per request
CHAT_8_VS_1_TARGET = 4.0  # our runtime, 8 streams over 1
TTFT_TARGET = 1.2  # TTFT p50 over (decode step p50 + router hop p50), at most
ROUTER_CPU_EMBEDDING_TARGET_US = 1000.0  # router-replica CPU per embedding request, at most


def _goal(
    value: float | None, target: float, unit: str, *, at_most: bool = False, missing: str = ""
) -> dict[str, Any]:
    met = value is not None and (value <= target if at_most else value >= target)
    goal: dict[str, Any] = {
        "value": value,
        "target": target,
        "at_most": at_most,
        "met": met,
        "unit": unit,
    }
    if value is None:
        goal["missing"] = missing or "not measured: counts as a miss"
    return goal


def _get(tree: Mapping[str, Any], *path: str) -> Any:
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def goals(results: Mapping[str, Any]) -> dict[str, Any]:
    """Every goal of issue 14 this suite measures; None (not computed) is a miss, with why."""
    c32 = _get(results, "embeddings", "clients_32") or {}
    c1 = _get(results, "embeddings", "clients_1") or {}
    p50_32 = c32.get("p50_ratio")
    step = _get(results, "decode", "step_ms_p50_batch_1")
    hop = _get(results, "chat", "router_hop", "p50_ms")
    ttft = _get(results, "chat", "ttft", "p50_ms")
    ttft_ratio = ratio(ttft, step + hop) if step is not None and hop is not None else None
    return {
        "embeddings_32_clients_throughput_vs_docs_pattern": _goal(
            c32.get("throughput_ratio"), EMBEDDING_32_TARGET, "x requests/s"
        ),
        "embeddings_32_clients_p50_vs_docs_pattern": _goal(
            p50_32, 1.0, "x p50 latency", at_most=True
        ),
        "embeddings_1_client_throughput_vs_docs_pattern": _goal(
            c1.get("throughput_ratio"), EMBEDDING_1_TARGET, "x requests/s"
        ),
        "chat_16_streams_vs_generate_per_request": _goal(
            _get(results, "chat", "ratio_vs_generate_per_request"), CHAT_PEER_TARGET, "x tokens/s"
        ),
        "chat_8_vs_1_streams_on_our_runtime": _goal(
            _get(results, "decode", "speedup_8_vs_1"), CHAT_8_VS_1_TARGET, "x tokens/s"
        ),
        "ttft_p50_vs_decode_step_plus_router_hop": _goal(
            ttft_ratio, TTFT_TARGET, "x", at_most=True
        ),
        "router_cpu_per_embedding_request": _goal(
            _get(results, "router_cpu", "embeddings", "router_cpu_us_per_request"),
            ROUTER_CPU_EMBEDDING_TARGET_US,
            "µs",
            at_most=True,
        ),
    }
