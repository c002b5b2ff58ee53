"""Kimi-K2's routed experts through ONNX Runtime's MoE op (deployments/export/fused_moe.py): the
PyTorch reference is transformers' own experts, the op is the reference, and the exported graph
runs one MoE node per MoE layer instead of copying every token's expert weights."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

from deployments.contracts.manifest import ModelManifest
from deployments.export.fused_moe import NOT_CHOSEN, fused_moe, use_fused_experts
from deployments.export.llm import default_model
from deployments.export.llm_torch_graph import prepare_for_export


def test_the_fused_experts_give_transformers_logits():
    with tempfile.TemporaryDirectory() as scratch:
        model, _ = default_model("kimi", Path(scratch))
    fused = copy.deepcopy(model)
    assert use_fused_experts(fused) == model.config.num_hidden_layers - 1  # the first is dense
    ids = torch.tensor([[5, 900, 17, 3000, 42, 7, 1234, 99]])
    with torch.no_grad():
        expected, actual = model(input_ids=ids).logits, fused(input_ids=ids).logits
    assert torch.allclose(actual, expected, atol=1e-6), (actual - expected).abs().max()


def _moe_graph(gate_up: np.ndarray, down: np.ndarray, k: int) -> ort.InferenceSession:
    node = helper.make_node(
        "MoE",
        ["hidden", "router", "gate_up", "", "down"],
        ["out"],
        domain="com.microsoft",
        k=k,
        activation_type="swiglu",
        swiglu_fusion=1,
        normalize_routing_weights=0,
        activation_alpha=1.0,
        activation_beta=0.0,
    )
    experts, _, hidden = gate_up.shape
    graph = helper.make_graph(
        [node],
        "moe",
        [
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["tokens", hidden]),
            helper.make_tensor_value_info("router", TensorProto.FLOAT, ["tokens", experts]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["tokens", hidden])],
        initializer=[
            numpy_helper.from_array(gate_up, "gate_up"),
            numpy_helper.from_array(down, "down"),
        ],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_onnx_runtimes_moe_op_weighs_the_chosen_experts_as_the_reference_does():
    """The router's input is the log of each chosen expert's weight (the others NOT_CHOSEN): the
    op picks exactly those and weighs them by their shares of the weights' sum, values large
    enough for any clamp inside the op's SwiGLU to show."""
    rng = np.random.default_rng(7)
    tokens, hidden, inter, experts, k = 6, 32, 24, 8, 3
    gate_up = (rng.standard_normal((experts, 2 * inter, hidden)) * 1.5).astype(np.float32)
    down = (rng.standard_normal((experts, hidden, inter)) * 0.5).astype(np.float32)
    states = rng.standard_normal((tokens, hidden)).astype(np.float32)
    chosen = np.stack([rng.choice(experts, k, replace=False) for _ in range(tokens)])
    weights = rng.uniform(0.05, 3.0, (tokens, k)).astype(np.float32)
    router = np.full((tokens, experts), NOT_CHOSEN, dtype=np.float32)
    np.put_along_axis(router, chosen, np.log(weights), axis=1)

    (actual,) = _moe_graph(gate_up, down, k).run(None, {"hidden": states, "router": router})
    reference = fused_moe(
        torch.from_numpy(states),
        torch.from_numpy(router),
        torch.from_numpy(gate_up),
        torch.from_numpy(down),
        k,
    ).numpy()
    by_hand = np.zeros_like(states)
    for token in range(tokens):
        for expert, weight in zip(chosen[token], weights[token], strict=True):
            both = gate_up[expert] @ states[token]
            gate, up = both[0::2], both[1::2]
            mixed = down[expert] @ (gate / (1 + np.exp(-gate)) * up)
            by_hand[token] += weight / weights[token].sum() * mixed
    assert np.abs(by_hand).max() > 10  # a clamp at 7, as gpt-oss's SwiGLU has, would show
    np.testing.assert_allclose(reference, by_hand, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(actual, by_hand, rtol=1e-4, atol=1e-4)


def test_the_kimi_graph_runs_each_moe_layer_as_one_moe_node(models_root: Path):
    """No node gathers expert weights per token (transformers' export-friendly experts did:
    25 MB per token and layer at size, and a 1,500-token prompt failed for want of 25 GB)."""
    manifest = ModelManifest.load(models_root / "kimi")
    graph = onnx.load(models_root / "kimi" / manifest.graph, load_external_data=False).graph
    with tempfile.TemporaryDirectory() as scratch:
        model, _ = default_model("kimi", Path(scratch))
    moe_layers = model.config.num_hidden_layers - model.config.first_k_dense_replace
    assert [node.domain for node in graph.node if node.op_type == "MoE"] == ["com.microsoft"] * (
        moe_layers
    )
    expert_weights = {init.name for init in graph.initializer if ".mlp.experts." in init.name}
    gathers = [
        node.name
        for node in graph.node
        if node.op_type.startswith("Gather") and expert_weights & set(node.input)
    ]
    assert gathers == []


def test_prepare_for_export_fuses_the_experts_of_a_deepseek_model_only():
    with tempfile.TemporaryDirectory() as scratch:
        kimi, _ = default_model("kimi", Path(scratch))
        glm, _ = default_model("glm", Path(scratch))
    prepared = prepare_for_export(kimi)
    assert all(
        hasattr(layer.mlp.experts, "fused_gate_up")
        and not hasattr(layer.mlp.experts, "gate_up_proj")
        for layer in prepared.model.layers[prepared.config.first_k_dense_replace :]
    )
    assert use_fused_experts(glm) == 0
