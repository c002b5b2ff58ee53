"""The compute roof: FLOPs per generated token from a model's config (its weight GEMMs and its
attention at a context length), and this machine's fp32 GEMM FLOP/s at the model's own decode
step shape (16 rows times each weight's widths, numpy on every usable core)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np

# (rows in, columns out, how many such GEMMs one token runs)
Gemm = tuple[int, int, int]


def weight_gemms(config: Mapping[str, Any]) -> list[Gemm]:
    """The weight matrices one token multiplies through, from a transformers config.json
    (GLM-4 or DeepSeek-V3/Kimi-K2); a MoE layer counts the experts a token is routed to."""
    h, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    if config["model_type"] == "glm4":
        heads, kv, hd = (
            config["num_attention_heads"],
            config["num_key_value_heads"],
            config["head_dim"],
        )
        inter = config["intermediate_size"]
        per_layer = [
            (h, (heads + 2 * kv) * hd, 1),
            (heads * hd, h, 1),
            (h, 2 * inter, 1),
            (inter, h, 1),
        ]
        return [*_times(per_layer, layers), (h, vocab, 1)]
    if config["model_type"] == "deepseek_v3":
        return [*_mla_gemms(config), *_mlp_gemms(config), (h, vocab, 1)]
    raise ValueError(f"no FLOP count for model_type {config['model_type']!r}")


def _times(gemms: list[Gemm], layers: int) -> list[Gemm]:
    return [(k, n, count * layers) for k, n, count in gemms]


def _mla_gemms(c: Mapping[str, Any]) -> list[Gemm]:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    q = (
        [(h, c["q_lora_rank"], 1), (c["q_lora_rank"], heads * qk, 1)]
        if c.get("q_lora_rank")
        else [(h, heads * qk, 1)]
    )
    kv = [
        (h, c["kv_lora_rank"] + c["qk_rope_head_dim"], 1),
        (c["kv_lora_rank"], heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), 1),
    ]
    return _times([*q, *kv, (heads * c["v_head_dim"], h, 1)], c["num_hidden_layers"])


def _mlp_gemms(c: Mapping[str, Any]) -> list[Gemm]:
    h, dense = c["hidden_size"], c["first_k_dense_replace"]
    inter, moe = c["intermediate_size"], c["moe_intermediate_size"]
    shared = moe * c["n_shared_experts"]
    routed = c["num_experts_per_tok"]
    moe_layer = [
        (h, c["n_routed_experts"], 1),  # the router's scores
        (h, 2 * moe, routed),
        (moe, h, routed),
        (h, 2 * shared, 1),
        (shared, h, 1),
    ]
    return [
        *_times([(h, 2 * inter, 1), (inter, h, 1)], dense),
        *_times(moe_layer, c["num_hidden_layers"] - dense),
    ]


def attention_flops(config: Mapping[str, Any], context: int) -> float:
    """Scores and the weighted sum for one new token over `context` cached positions."""
    heads, layers = config["num_attention_heads"], config["num_hidden_layers"]
    if config["model_type"] == "glm4":
        width = 2 * config["head_dim"]  # q.k, then p.v
    else:
        width = config["qk_nope_head_dim"] + config["qk_rope_head_dim"] + config["v_head_dim"]
    return 2.0 * heads * width * context * layers


def flops_per_token(config: Mapping[str, Any], context: int) -> float:
    return sum(2.0 * k * n * count for k, n, count in weight_gemms(config)) + attention_flops(
        config, context
    )


def gemm_flops_per_s(gemms: list[Gemm], rows: int, repeats: int) -> dict[str, Any]:
    """fp32 FLOP/s of `rows` x k @ k x n over the model's weight shapes, each timed `repeats`
    times (best of), weighted by how often a token runs it: the roof a decode step of `rows`
    sequences can reach on this machine."""
    rng = np.random.default_rng(0)
    flops = seconds = 0.0
    for k, n, count in sorted(set(gemms)):
        x = rng.standard_normal((rows, k), dtype=np.float32)
        w = rng.standard_normal((k, n), dtype=np.float32)
        x @ w  # warm: first-call allocation and thread start
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            x @ w
            best = min(best, time.perf_counter() - started)
        flops += 2.0 * rows * k * n * count
        seconds += best * count
    return {
        "rows": rows,
        "gflops_per_s": round(flops / seconds / 1e9, 2),
        "shapes": len(set(gemms)),
    }
