"""DeepSeek-V3's routed experts (Kimi-K2's MoE layers) exported as ONNX Runtime's `MoE` contrib op
(com.microsoft, CPU and CUDA), which groups the tokens by expert and runs one GEMM per expert hit.

transformers' export-friendly experts (`batched_mm`) gather every token's own copy of its experts'
weights: at the at-size Kimi (8 of 64 experts of 256, hidden 1,024) 25 MB per token and MoE layer,
so a 16-sequence decode step copied about 400 MB per layer and a 1,500-token prompt asked for a
25 GB buffer and failed. The op reads each expert's weights once per call, whatever the tokens.

The router stays the model's own (sigmoid scores, the correction bias, groups, top-k, the
normalisation and the routed scaling factor, in plain ONNX ops). The op's own routing is a softmax
and a top-k over its `router_probs`; given the log of the chosen experts' final weights (and a
large negative number for the others) it picks exactly those experts and weighs them by the
weights' shares, so the output times each token's weight sum is the experts' weighted sum.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek_v3

# The router input of an expert a token did not choose: softmax gives it 0 (float32 safe).
NOT_CHOSEN = -1e30


@torch.library.custom_op("edge_export::moe", mutates_args=())
def fused_moe(
    hidden: torch.Tensor, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, k: int
) -> torch.Tensor:
    """ONNX Runtime's `MoE` (swiglu, interleaved gate and up rows, no normalisation) in PyTorch:
    the reference the exported graph is verified against. `hidden` (..., hidden) with `router`
    (tokens, experts) a row per token, `gate_up` (experts, 2 x inter, hidden), `down`
    (experts, hidden, inter)."""
    shares, chosen = torch.softmax(router, dim=-1).topk(k, dim=-1)
    rows = hidden.reshape(-1, hidden.shape[-1])
    out = torch.zeros_like(rows)
    for expert in range(gate_up.shape[0]):
        token, slot = torch.where(chosen == expert)
        if token.numel() == 0:
            continue
        both = rows[token] @ gate_up[expert].T
        gate, up = both[:, 0::2], both[:, 1::2]
        mixed = (torch.nn.functional.silu(gate) * up) @ down[expert].T
        out.index_add_(0, token, mixed * shares[token, slot, None])
    return out.view(hidden.shape)


@fused_moe.register_fake
def _(
    hidden: torch.Tensor, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, k: int
) -> torch.Tensor:
    return torch.empty_like(hidden)


def translation_table() -> dict[Any, Callable[..., Any]]:
    """For `torch.onnx.export(custom_translation_table=...)`: the op as com.microsoft `MoE`."""
    import onnxscript

    _register_schema()
    microsoft_moe = onnxscript.values.Opset("com.microsoft", 1).MoE

    def moe(hidden: Any, router: Any, gate_up: Any, down: Any, k: int) -> Any:
        return microsoft_moe(
            hidden,
            router,
            gate_up,
            None,
            down,
            k=k,
            activation_type="swiglu",
            swiglu_fusion=1,  # gate and up rows interleaved, as the CPU kernel requires
            normalize_routing_weights=0,
            activation_alpha=1.0,
            activation_beta=0.0,
        )

    return {torch.ops.edge_export.moe.default: moe}


def _register_schema() -> None:
    """The op's signature (what we use of it) in onnx's registry, where onnxscript looks an op
    up: ONNX Runtime's contrib ops live in its own registry, not onnx's."""
    import onnx.defs
    from onnx.defs import OpSchema

    if onnx.defs.has("MoE", "com.microsoft"):
        return
    option = OpSchema.FormalParameterOption
    names = ["input", "router_probs", "fc1_experts_weights", "fc1_experts_bias"]
    inputs = [
        OpSchema.FormalParameter(
            name, "T", param_option=option.Optional if "bias" in name else option.Single
        )
        for name in [*names, "fc2_experts_weights"]
    ]
    attributes = [
        OpSchema.Attribute("k", OpSchema.AttrType.INT, "experts per token"),
        OpSchema.Attribute("activation_type", OpSchema.AttrType.STRING, "swiglu"),
        OpSchema.Attribute("swiglu_fusion", OpSchema.AttrType.INT, "1: interleaved"),
        OpSchema.Attribute("normalize_routing_weights", OpSchema.AttrType.INT, "0 or 1"),
        OpSchema.Attribute("activation_alpha", OpSchema.AttrType.FLOAT, "1.0: SiLU"),
        OpSchema.Attribute("activation_beta", OpSchema.AttrType.FLOAT, "0.0"),
    ]
    onnx.defs.register_schema(
        OpSchema(
            "MoE",
            "com.microsoft",
            1,
            inputs=inputs,
            outputs=[OpSchema.FormalParameter("output", "T")],
            type_constraints=[("T", ["tensor(float)", "tensor(float16)"], "")],
            attributes=attributes,
        )
    )


def _moe_forward(self: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """DeepseekV3MoE.forward, its routed experts through the fused op. The op takes the block's
    input as it is, not a reshaped view of it: ONNX Runtime lets the op write its output over
    its input, and over a view (an alias of a tensor the shared expert still reads) the logits
    came out wrong (0.09 off on the tiny Kimi)."""
    block: Any = self
    experts = block.experts
    _, top_k_weights, top_k_index = block.gate(hidden_states)
    weights = top_k_weights.to(hidden_states.dtype)
    total = weights.sum(dim=-1, keepdim=True)
    router = torch.full(
        (top_k_index.shape[0], experts.num_experts),
        NOT_CHOSEN,
        dtype=hidden_states.dtype,
        device=hidden_states.device,
    ).scatter(1, top_k_index, torch.log(weights))
    shared = block.shared_experts(hidden_states)
    routed = fused_moe(
        hidden_states, router, experts.fused_gate_up, experts.down_proj, top_k_index.shape[-1]
    )
    return routed * total.view(*hidden_states.shape[:-1], 1) + shared


def use_fused_experts(model: torch.nn.Module) -> int:
    """Every DeepSeek-V3 MoE block of `model` runs its routed experts through the fused op; the
    number changed. The experts' gate and up weights are stored interleaved (row 2i the gate's
    i, 2i+1 the up's), the form the op reads, in place of transformers' halves."""
    changed = 0
    for module in model.modules():
        if not isinstance(module, deepseek_v3.DeepseekV3MoE):
            continue
        experts: Any = module.experts
        probe = torch.linspace(-4, 4, 9)
        if not torch.allclose(experts.act_fn(probe), torch.nn.functional.silu(probe)):
            raise ValueError(f"fused experts need SiLU gating, not {experts.act_fn}")
        gate, up = experts.gate_up_proj.detach().chunk(2, dim=1)
        count, inter, hidden = gate.shape
        interleaved = torch.stack([gate, up], dim=2).reshape(count, 2 * inter, hidden)
        experts.fused_gate_up = torch.nn.Parameter(interleaved.contiguous(), requires_grad=False)
        del experts.gate_up_proj  # one copy of the weights in the graph, not two
        module.forward = types.MethodType(_moe_forward, module)  # type: ignore[method-assign]
        changed += 1
    return changed
