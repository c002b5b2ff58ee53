"""GLM-4 as a fused "split attention" decoder graph over a slot cache, built op by op from a
`Glm4ForCausalLM`'s weights (no tracing): the `--attention fused` export.

Inputs: `input_ids` int64 [batch, seq]; `seqlens_k` int32 [batch] (each row's total length - 1,
new tokens counted); `total_seq_len` int32 [] (max over rows of past + new); `past_key_<l>`,
`past_value_<l>` float [batch, kv_heads, capacity, head_dim]. Outputs: `logits` [batch, vocab] of
the last position, `present_key_<l>`, `present_value_<l>`: bound to the same buffers as the past
(`SlotDecoder`), so a token writes one position of the cache and nothing else is copied.

Per layer, GroupQueryAttention with kv_heads heads is only the cache writer (it rotates the new
keys and writes keys and values in place); the query heads, rotated by RotaryEmbedding, attend as
one GEMM per (row, KV head) over the whole buffer, masked past each row's length. ONNX Runtime's
CPU GQA kernel runs one GEMV per (row, query head) instead: at 16 rows x 512 positions 2.3-4.4 ms
a layer against 0.9 ms (measured in the prototype, /work/scratch/engine/README.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import onnx
from onnx import TensorProto, helper
from transformers import Glm4Config, PreTrainedModel

from deployments.contracts.manifest import KVCacheLayout

OPSET = 21
# Every external tensor starts at a 64 KiB offset: ONNX Runtime can map them straight from the
# file, and equal weights give equal bytes.
ALIGN = 1 << 16
INLINE_BELOW_BYTES = 4096
MASKED = -1e30


@dataclass(frozen=True)
class GlmShape:
    """What the graph needs of a Glm4Config."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    eps: float
    max_positions: int

    @classmethod
    def of(cls, config: Glm4Config) -> GlmShape:
        rope = dict(config.rope_parameters or {})
        if rope.get("rope_type", "default") != "default":
            raise ValueError(
                "the fused graph builds default RoPE only (scaled RoPE needs other caches)"
            )
        partial = float(rope.get("partial_rotary_factor", 0.5))
        return cls(
            vocab=config.vocab_size,
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            layers=config.num_hidden_layers,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            rotary_dim=int(config.head_dim * partial),
            rope_theta=float(rope.get("rope_theta", 10_000.0)),
            eps=float(config.rms_norm_eps),
            max_positions=config.max_position_embeddings,
        )

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim


class _ExternalWriter:
    """Initializers written straight to the data file as they are made, so building holds one
    tensor at a time beside the model, never a second copy of all weights in protobuf."""

    def __init__(self, data_path: Path):
        self.data_path = data_path
        self.file = data_path.open("wb")
        self.offset = 0
        self.initializers: list[TensorProto] = []

    def add(self, name: str, array: np.ndarray) -> str:
        array = np.array(array, order="C", copy=None)  # ascontiguousarray would make 0-d 1-d
        if array.nbytes < INLINE_BELOW_BYTES:
            self.initializers.append(onnx.numpy_helper.from_array(array, name))
            return name
        pad = -self.offset % ALIGN
        self.file.write(b"\0" * pad)
        self.offset += pad
        self.file.write(array.tobytes())
        tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype))
        tensor.dims.extend(array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (
            ("location", self.data_path.name),
            ("offset", str(self.offset)),
            ("length", str(array.nbytes)),
        ):
            tensor.external_data.add(key=key, value=value)
        self.offset += array.nbytes
        self.initializers.append(tensor)
        return name


class _Nodes:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []

    def __call__(self, op: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs):  # type: ignore[no-untyped-def]
        name = f"{op}_{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs


def rope_cache(shape: GlmShape) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin [max_positions, rotary_dim / 2]. GLM-4 rotates the first rotary_dim channels of a
    head in interleaved pairs (2i, 2i + 1) by position x theta^(-2i / rotary_dim): transformers'
    Glm4 rotate_half over repeat_interleave, which is GQA's and RotaryEmbedding's interleaved=1."""
    rot = shape.rotary_dim
    inv_freq = 1.0 / (shape.rope_theta ** (np.arange(0, rot, 2, dtype=np.float32) / rot))
    freqs = np.arange(shape.max_positions, dtype=np.float32)[:, None] * inv_freq[None, :]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


# The cache inputs and outputs, as the manifest's KVCacheLayout names them.
CACHE_NAME_TEMPLATES = {
    "past_key_template": "past_key_{layer}",
    "past_value_template": "past_value_{layer}",
    "present_key_template": "present_key_{layer}",
    "present_value_template": "present_value_{layer}",
}


def cache_names(layer: int) -> tuple[str, ...]:
    """(past key, past value, present key, present value) of `layer`."""
    return tuple(t.format(layer=layer) for t in CACHE_NAME_TEMPLATES.values())


def slot_cache_layout(config: Glm4Config) -> KVCacheLayout:
    return KVCacheLayout(
        layout="slots",
        num_layers=config.num_hidden_layers,
        num_kv_heads=config.num_key_value_heads,
        key_head_dim=config.head_dim,
        value_head_dim=config.head_dim,
        **CACHE_NAME_TEMPLATES,
    )


def build_fused_glm(model: PreTrainedModel, path: Path) -> GlmShape:
    """Write the graph to `path` and its weights to `path` + `.data`; return its shape."""
    shape = GlmShape.of(cast(Glm4Config, model.config))
    weights = {name: t.detach().float().numpy() for name, t in model.state_dict().items()}
    writer = _ExternalWriter(path.with_name(path.name + ".data"))
    node = _Nodes()
    try:
        inputs, outputs = _build(shape, weights.__getitem__, writer, node)
    finally:
        writer.file.close()
    graph = helper.make_graph(node.nodes, "glm4_slot_decoder", inputs, outputs, writer.initializers)
    onnx_model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("com.microsoft", 1)],
        producer_name="deployments.export",
    )
    onnx_model.ir_version = 10
    onnx.save(onnx_model, str(path))
    return shape


def _build(
    shape: GlmShape,
    w: Callable[[str], np.ndarray],
    writer: _ExternalWriter,
    node: _Nodes,
) -> tuple[list[onnx.ValueInfoProto], list[onnx.ValueInfoProto]]:
    cos, sin = rope_cache(shape)
    writer.add("cos_cache", cos)
    writer.add("sin_cache", sin)
    writer.add("embed", w("model.embed_tokens.weight"))
    hidden = node("Gather", ["embed", "input_ids"], ["embedded"], axis=0)
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch"]),
        helper.make_tensor_value_info("total_seq_len", TensorProto.INT32, []),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", shape.vocab])]
    cache_shape: list[str | int] = ["batch", shape.kv_heads, "capacity", shape.head_dim]
    _attention_inputs(shape, writer, node)
    eps = shape.eps
    norm_in = writer.add("l0.input_norm", w("model.layers.0.input_layernorm.weight"))
    x = node("SimplifiedLayerNormalization", [hidden, norm_in], ["l0.x"], axis=-1, epsilon=eps)
    for layer in range(shape.layers):
        p, lp = f"model.layers.{layer}.", f"l{layer}"
        names = cache_names(layer)
        for name in names[:2]:
            inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, cache_shape))
        for name in names[2:]:
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, cache_shape))
        projections = ("q", "k", "v")
        writer.add(
            f"{lp}.wqkv",
            np.concatenate([w(p + f"self_attn.{n}_proj.weight").T for n in projections], axis=1),
        )
        writer.add(
            f"{lp}.bqkv", np.concatenate([w(p + f"self_attn.{n}_proj.bias") for n in projections])
        )
        qkv = node(
            "Add",
            [node("MatMul", [x, f"{lp}.wqkv"], [f"{lp}.qkv_mm"]), f"{lp}.bqkv"],
            [f"{lp}.qkv"],
        )
        attn = _split_attention(shape, node, qkv, layer)
        writer.add(f"{lp}.wo", w(p + "self_attn.o_proj.weight").T)
        o = node("MatMul", [attn, f"{lp}.wo"], [f"{lp}.o"])
        post_attn = writer.add(f"{lp}.post_attn_norm", w(p + "post_self_attn_layernorm.weight"))
        a = node("SimplifiedLayerNormalization", [o, post_attn], [f"{lp}.a"], axis=-1, epsilon=eps)
        mlp_norm = writer.add(f"{lp}.mlp_norm", w(p + "post_attention_layernorm.weight"))
        # SkipSimplifiedLayerNormalization: output 0 the normed sum, output 3 the residual sum.
        x2, hidden = node(
            "SkipSimplifiedLayerNormalization",
            [a, hidden, mlp_norm],
            [f"{lp}.x2", "", "", f"{lp}.h1"],
            domain="com.microsoft",
            epsilon=eps,
        )[0::3]
        writer.add(f"{lp}.wgu", w(p + "mlp.gate_up_proj.weight").T)
        gu = node("MatMul", [x2, f"{lp}.wgu"], [f"{lp}.gu"])
        writer.add(f"{lp}.split", np.array([shape.intermediate] * 2, np.int64))
        gate, up = node("Split", [gu, f"{lp}.split"], [f"{lp}.g", f"{lp}.u"], axis=-1)
        # SiLU as gate * sigmoid(gate): ONNX Runtime fuses it (QuickGelu with alpha 1).
        silu = node("Mul", [gate, node("Sigmoid", [gate], [f"{lp}.sig"])], [f"{lp}.silu"])
        act = node("Mul", [silu, up], [f"{lp}.act"])
        writer.add(f"{lp}.wd", w(p + "mlp.down_proj.weight").T)
        down = node("MatMul", [act, f"{lp}.wd"], [f"{lp}.down"])
        post_mlp = writer.add(f"{lp}.post_mlp_norm", w(p + "post_mlp_layernorm.weight"))
        m = node(
            "SimplifiedLayerNormalization", [down, post_mlp], [f"{lp}.m"], axis=-1, epsilon=eps
        )
        last = layer + 1 == shape.layers
        next_norm = writer.add(
            "final_norm" if last else f"l{layer + 1}.input_norm",
            w("model.norm.weight" if last else f"model.layers.{layer + 1}.input_layernorm.weight"),
        )
        x, hidden = node(
            "SkipSimplifiedLayerNormalization",
            [m, hidden, next_norm],
            [f"{lp}.xn", "", "", f"{lp}.h2"],
            domain="com.microsoft",
            epsilon=eps,
        )[0::3]
    # The head on the last position only: [batch, seq, H] -> [batch, H] -> [batch, vocab].
    writer.add("last_index", np.array(-1, np.int64))
    last_hidden = node("Gather", [x, "last_index"], ["last_hidden"], axis=1)
    writer.add("lm_head", w("lm_head.weight").T)
    node("MatMul", [last_hidden, "lm_head"], ["logits"])
    return inputs, outputs


def _attention_inputs(shape: GlmShape, writer: _ExternalWriter, node: _Nodes) -> None:
    """What every layer's attention shares, computed once per run from `seqlens_k`, the input
    length S and the bound capacity C:
      q_pos [batch, S] int64: each new token's position = seqlens_k - S + 1 + s
      mask_bias [batch, 1, S, 1, C]: 0 where key j <= q_pos, -1e30 elsewhere (the rest of the
        slot buffer, other rows' longer lengths, the causal future)."""
    for name, value, dtype in (
        ("c_zero", 0, np.int64),
        ("c_one", 1, np.int64),
        ("c_ax1", [1], np.int64),
        ("c_ax_m1", [-1], np.int64),
        ("c_ax_mask", [1, 3], np.int64),
        ("c_neg", MASKED, np.float32),
        ("c_zf", 0.0, np.float32),
        ("c_scores5_head", [0, 0, -1, shape.group], np.int64),
        ("c_scores4_head", [0, 0, -1], np.int64),
        ("c_q4_shape", [0, 0, -1, shape.head_dim], np.int64),
        ("c_q5_shape", [0, 0, shape.kv_heads, shape.group, shape.head_dim], np.int64),
        ("c_ctx5_shape", [0, 0, -1, shape.group, shape.head_dim], np.int64),
        ("c_attn_shape", [0, 0, shape.q_dim], np.int64),
        ("c_qkv_split", [shape.q_dim, shape.kv_dim, shape.kv_dim], np.int64),
    ):
        writer.add(name, np.array(value, dtype))
    node("Shape", ["input_ids"], ["seq_len_1d"], start=1, end=2)
    node("Squeeze", ["seq_len_1d"], ["seq_len"])
    node("Range", ["c_zero", "seq_len", "c_one"], ["seq_range"])  # [S]
    node("Cast", ["seqlens_k"], ["seqlens_64"], to=TensorProto.INT64)
    node("Unsqueeze", ["seqlens_64", "c_ax1"], ["last_pos"])  # [B, 1]
    node("Sub", ["last_pos", "seq_len"], ["first_pos_m1"])
    node("Add", ["first_pos_m1", "c_one"], ["first_pos"])
    node("Add", ["first_pos", "seq_range"], ["q_pos"])  # [B, S]
    node("Shape", ["past_key_0"], ["cap_1d"], start=2, end=3)
    node("Squeeze", ["cap_1d"], ["cap"])
    node("Range", ["c_zero", "cap", "c_one"], ["key_pos"])  # [C]
    node("Unsqueeze", ["q_pos", "c_ax_m1"], ["q_pos3"])  # [B, S, 1]
    node("Greater", ["key_pos", "q_pos3"], ["future"])  # [B, S, C]
    node("Where", ["future", "c_neg", "c_zf"], ["mask3"])
    node("Unsqueeze", ["mask3", "c_ax_mask"], ["mask_bias"])  # [B, 1, S, 1, C]
    node("Concat", ["c_scores5_head", "cap_1d"], ["scores5_shape"], axis=0)  # [0,0,-1,g,C]
    node("Concat", ["c_scores4_head", "cap_1d"], ["scores4_shape"], axis=0)  # [0,0,-1,C]


def _split_attention(shape: GlmShape, node: _Nodes, qkv: str, layer: int) -> str:
    """GroupQueryAttention writes the cache; the query heads attend with GEMMs over it."""
    lp, d = f"l{layer}", shape.head_dim
    past_k, past_v, present_k, present_v = cache_names(layer)
    q, k, v = node("Split", [qkv, "c_qkv_split"], [f"{lp}.q", f"{lp}.k", f"{lp}.v"], axis=-1)
    # num_heads = kv_num_heads and the key as its own query: the op's attention work is 1/group
    # of the full op's and its output is unused; what is kept is the rotated keys and values
    # written in place into the shared past/present buffer.
    node(
        "GroupQueryAttention",
        [k, k, v, past_k, past_v, "seqlens_k", "total_seq_len", "cos_cache", "sin_cache"],
        [f"{lp}.writer_out", present_k, present_v],
        domain="com.microsoft",
        num_heads=shape.kv_heads,
        kv_num_heads=shape.kv_heads,
        do_rotary=1,
        rotary_interleaved=1,
    )
    q_rot = node(
        "RotaryEmbedding",
        [q, "q_pos", "cos_cache", "sin_cache"],
        [f"{lp}.q_rot"],
        domain="com.microsoft",
        interleaved=1,
        num_heads=shape.heads,
        rotary_embedding_dim=shape.rotary_dim,
    )
    q5 = node("Reshape", [q_rot, "c_q5_shape"], [f"{lp}.q5"])  # [B, S, kv, g, d]
    q5 = node("Transpose", [q5], [f"{lp}.q5t"], perm=[0, 2, 1, 3, 4])  # [B, kv, S, g, d]
    # 4-D operands, so ONNX Runtime runs one M = S x g product per (row, KV head); a 5-D
    # broadcast would run one small GEMM, re-packing the keys, per query position.
    q4 = node("Reshape", [q5, "c_q4_shape"], [f"{lp}.q4"])  # [B, kv, S*g, d]
    scores = node(
        "FusedMatMul",
        [q4, present_k],
        [f"{lp}.scores"],
        domain="com.microsoft",
        transB=1,
        alpha=float(d**-0.5),
    )  # [B, kv, S*g, C]
    scores = node("Reshape", [scores, "scores5_shape"], [f"{lp}.scores5"])  # [B, kv, S, g, C]
    scores = node("Add", [scores, "mask_bias"], [f"{lp}.scores_m"])
    probs = node("Softmax", [scores], [f"{lp}.probs"], axis=-1)
    probs = node("Reshape", [probs, "scores4_shape"], [f"{lp}.probs4"])  # [B, kv, S*g, C]
    ctx = node("MatMul", [probs, present_v], [f"{lp}.ctx"])  # [B, kv, S*g, d]
    ctx = node("Reshape", [ctx, "c_ctx5_shape"], [f"{lp}.ctx5"])  # [B, kv, S, g, d]
    ctx = node("Transpose", [ctx], [f"{lp}.ctx_t"], perm=[0, 2, 1, 3, 4])  # [B, S, kv, g, d]
    return node("Reshape", [ctx, "c_attn_shape"], [f"{lp}.attn"])  # [B, S, heads * d]
