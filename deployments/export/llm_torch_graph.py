"""The plain decoder graph: `torch.onnx` (dynamo) of the `transformers` model itself, its KV cache
taken as `past_key_values.{i}.*` and returned one position longer as `present.{i}.*` (the
"concat" layout every family exports to, MLA's latent cache included); int8 by
`quantize_dynamic`."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import onnx
import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek_v3

from deployments.contracts.manifest import KVCacheLayout
from deployments.export.common import strip_trace_metadata
from deployments.export.fused_moe import translation_table as moe_translation_table
from deployments.export.fused_moe import use_fused_experts
from deployments.export.llm_families import SEED

# Weights above this go to an external data file next to the graph (protobuf caps a file at 2 GiB).
EXTERNAL_DATA_BYTES = 1 << 30


class DecoderWithCache(torch.nn.Module):
    """Flat tensors in and out, so the exported graph has one named input per cache tensor."""

    def __init__(self, model: PreTrainedModel):
        super().__init__()
        self.model = model
        self.num_layers = model.config.num_hidden_layers

    def forward(self, input_ids, attention_mask, position_ids, *past):  # type: ignore[no-untyped-def]
        cache = DynamicCache(config=self.model.config)
        for layer in range(self.num_layers):
            cache.update(past[2 * layer], past[2 * layer + 1], layer)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        flat: list[torch.Tensor] = []
        for layer in out.past_key_values.layers:
            flat += [layer.keys, layer.values]
        return (out.logits, *flat)


def _absorbed_mla_forward(
    self: torch.nn.Module,
    hidden_states: torch.Tensor,
    position_embeddings: tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor | None,
    past_key_values: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """DeepSeek-V3's attention, same maths, with the latent up-projection absorbed (as vLLM and
    DeepSeek's own inference do): the query is projected into the latent space and attends over
    the cached latent itself, and the values come out of the latent after the weighted sum.
    transformers' form expands every cached position's latent into per-head keys and values at
    every decode step: with Kimi-K2's 512-wide latent, a 16-sequence step took about 3x as long
    (9.8-23.7 ms against 3.5-7.6 ms over 128 tokens)."""
    attention: Any = self  # DeepSeek-V3's attention module: its fields are not typed on Module
    heads, rank = attention.num_heads, attention.kv_lora_rank
    nope, rope, value = attention.qk_nope_head_dim, attention.qk_rope_head_dim, attention.v_head_dim
    batch, length = hidden_states.shape[:-1]
    if attention.q_lora_rank is None:
        query = attention.q_proj(hidden_states)
    else:
        query = attention.q_b_proj(attention.q_a_layernorm(attention.q_a_proj(hidden_states)))
    query = query.view(batch, length, heads, nope + rope).transpose(1, 2)
    q_nope, q_rot = torch.split(query, [nope, rope], dim=-1)
    latent, k_rot = torch.split(attention.kv_a_proj_with_mqa(hidden_states), [rank, rope], dim=-1)
    latent = attention.kv_a_layernorm(latent).view(batch, 1, length, rank)
    k_rot = k_rot.view(batch, 1, length, rope)
    cos, sin = position_embeddings
    rotate = (
        deepseek_v3.apply_rotary_pos_emb_interleave
        if attention.config.rope_interleave
        else deepseek_v3.apply_rotary_pos_emb
    )
    q_rot, k_rot = rotate(q_rot, k_rot, cos, sin)
    if past_key_values is not None:
        latent, k_rot = past_key_values.update(latent, k_rot, attention.layer_idx)
    up = attention.kv_b_proj.weight.view(heads, nope + value, rank)
    up_key, up_value = torch.split(up, [nope, value], dim=1)
    scores = torch.matmul(torch.matmul(q_nope, up_key), latent.transpose(2, 3))
    scores = (scores + torch.matmul(q_rot, k_rot.transpose(2, 3))) * attention.scaling
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    output = torch.matmul(torch.matmul(weights, latent), up_value.transpose(1, 2))
    output = output.transpose(1, 2).reshape(batch, length, heads * value)
    return attention.o_proj(output), None


def prepare_for_export(model: PreTrainedModel) -> PreTrainedModel:
    # Eager attention translates to plain ONNX ops; DeepSeek-V3's routed experts to ONNX
    # Runtime's MoE op (fused_moe.py: transformers' export-friendly experts copy every token's
    # expert weights).
    model.config._attn_implementation = "eager"
    for module in model.modules():
        if isinstance(module, deepseek_v3.DeepseekV3Attention):
            module.forward = types.MethodType(_absorbed_mla_forward, module)  # type: ignore[method-assign]
    use_fused_experts(model)
    return model.eval()


def kv_layout(wrapper: DecoderWithCache) -> KVCacheLayout:
    """Read the cache shapes off one real forward pass: they differ by architecture (GLM caches
    per-head keys and values, DeepSeek-V3's MLA caches the compressed latent and the rope key)."""
    config = wrapper.model.config
    probe = torch.zeros((1, 2), dtype=torch.long)
    with torch.no_grad():
        out = wrapper.model(input_ids=probe, use_cache=True)
    first = out.past_key_values.layers[0]
    return KVCacheLayout(
        num_layers=config.num_hidden_layers,
        num_kv_heads=int(first.keys.shape[1]),
        key_head_dim=int(first.keys.shape[3]),
        value_head_dim=int(first.values.shape[3]),
    )


def export_graph(
    wrapper: DecoderWithCache, layout: KVCacheLayout, path: Path, dtype: torch.dtype
) -> None:
    batch, seq, past_len = 2, 5, 3
    vocab = wrapper.model.config.vocab_size
    gen = torch.Generator().manual_seed(SEED)
    names_in = ["input_ids", "attention_mask", "position_ids"]
    names_out = ["logits"]
    past: list[torch.Tensor] = []
    for layer in range(layout.num_layers):
        names_in += list(layout.past_names(layer))
        names_out += list(layout.present_names(layer))
        heads = layout.num_kv_heads
        for dim in (layout.key_head_dim, layout.value_head_dim):
            past.append(torch.randn(batch, heads, past_len, dim, generator=gen).to(dtype))
    args = (
        torch.randint(0, vocab, (batch, seq), generator=gen),
        torch.ones(batch, past_len + seq, dtype=torch.long),
        torch.arange(past_len, past_len + seq).repeat(batch, 1),
        *past,
    )
    b, s = torch.export.Dim("batch"), torch.export.Dim("seq")
    p, total = torch.export.Dim("past"), torch.export.Dim("total")
    dynamic_shapes = {
        "input_ids": {0: b, 1: s},
        "attention_mask": {0: b, 1: total},
        "position_ids": {0: b, 1: s},
        "past": tuple({0: b, 2: p} for _ in past),
    }
    n_bytes = sum(t.numel() * t.element_size() for t in wrapper.parameters())
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            args,
            str(path),
            input_names=names_in,
            output_names=names_out,
            dynamic_shapes=dynamic_shapes,
            dynamo=True,
            custom_translation_table=moe_translation_table(),
            external_data=n_bytes > EXTERNAL_DATA_BYTES,
            verbose=False,
        )
    # Same weights, same bytes: drop the exporter's stack traces (absolute paths, line numbers).
    graph = onnx.load(str(path), load_external_data=False)
    strip_trace_metadata(graph)
    onnx.save(graph, str(path))


def quantize_int8(path: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The exporter's recorded intermediate shapes trip the quantizer's own shape inference on
    # the MoE layers; it infers them afresh without them.
    model = onnx.load(str(path))
    del model.graph.value_info[:]
    onnx.save(model, str(path))
    quantized = path.with_suffix(".int8.onnx")
    # MoE router gates stay in float: a rounded router picks other experts, a jump no logit
    # tolerance absorbs, for a matmul of negligible cost.
    routers = [
        node.name
        for node in model.graph.node
        if any(name.endswith("mlp.gate.weight") for name in node.input)
    ]
    quantize_dynamic(
        str(path), str(quantized), weight_type=QuantType.QInt8, nodes_to_exclude=routers
    )
    quantized.replace(path)
