"""The chat suite's check that both sides serve the same weights: our graph's greedy tokens
after the benchmark's prompt against the peer's (PyTorch) and vLLM's for the same prompt ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from ray import serve

from benchmarks.chat.peer import PEER_APP, PEER_DEPLOYMENT, PEER_MODEL
from benchmarks.chat.vllm_peer import VllmServer
from benchmarks.lib.corpus import chat_messages
from deployments.replica.engine.llm import LLMRuntime

SAME_MODEL_TOKENS = 8


def our_greedy(models_dir: Path, model: str) -> tuple[list[int], list[int]]:
    """(the benchmark's prompt ids, our graph's greedy ids after it) for `model`."""
    runtime = LLMRuntime(models_dir / model)
    try:
        prompt = runtime.tokenizer.encode_chat(chat_messages())
        return prompt, runtime.graph.greedy_cached(prompt, SAME_MODEL_TOKENS)
    finally:
        runtime.close()


async def same_model_check(models_dir: Path) -> dict[str, Any]:
    """Greedy tokens from the peer's PyTorch model and from our ONNX graph must match."""
    prompt, ours = our_greedy(models_dir, PEER_MODEL)
    handle = serve.get_deployment_handle(PEER_DEPLOYMENT, app_name=PEER_APP)
    theirs = await handle.greedy.remote(prompt, SAME_MODEL_TOKENS)
    return {"greedy_tokens_equal": ours == theirs, "ours": ours, "peer": theirs}


def vllm_same_model_check(models_dir: Path, model: str, vllm: VllmServer) -> dict[str, Any]:
    """vLLM's greedy tokens for the same prompt ids (its completions API) against our graph's."""
    prompt, ours = our_greedy(models_dir, model)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": SAME_MODEL_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    answer = httpx.post(f"{vllm.base_url}/v1/completions", json=body, timeout=120)
    answer.raise_for_status()
    theirs = answer.json()["choices"][0]["token_ids"]
    return {"greedy_tokens_equal": ours == theirs, "ours": ours, "vllm": theirs}
