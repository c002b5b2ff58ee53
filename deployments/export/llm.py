"""GLM-4 and Kimi-K2 (DeepSeek-V3 layout) checkpoints -> KV-cache decoder ONNX model directories.

The same code exports a real checkpoint (`--from <HF id or dir>`) or the embedded default: the real
`transformers` architecture at tiny size with deterministic random weights and a locally built
tokenizer. Decoder graphs take and return the KV cache, so decoding never recomputes the prefix.
"""

from __future__ import annotations

import json
import logging
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import torch
import transformers
from transformers import (
    AutoTokenizer,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    DynamicCache,
    Glm4Config,
    Glm4ForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
)
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek_v3

from deployments.contracts.manifest import KVCacheLayout, LLMSpec, ModelManifest
from deployments.export.chat_tokenizer import CHAT_FORMATS, build_tokenizer, save_tokenizer
from deployments.export.common import (
    VerificationError,
    check_close,
    fresh_dir,
    strip_trace_metadata,
)
from deployments.export.progress import NO_STAGES, Stages
from deployments.export.revisions import CHAT_DEFAULT_REVISION
from deployments.export.tiktoken_tokenizer import has_tiktoken_tokenizer, kimi_tokenizer
from deployments.replica.engine.decoder import DecoderGraph
from deployments.replica.engine.session import SessionConfig, open_session

log = logging.getLogger(__name__)

Family = Literal["glm", "kimi"]
Dtype = Literal["fp32", "fp16"]

# Weights above this go to an external data file next to the graph (protobuf caps a file at 2 GiB).
EXTERNAL_DATA_BYTES = 1 << 30
DEFAULT_VOCAB_SIZE = 4096
DEFAULT_CONTEXT = 2048
SEED = 0
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}

# Parity tolerances of `--verify` against PyTorch fp32 logits, by what the graph was made into.
# fp32 differs only by kernel order; fp16 and int8 round weights, so they are judged relative to
# the logits' own spread, plus the cached-vs-recomputed token check inside the ONNX graph.
# Measured on the tiny defaults: int8 GLM 0.05 and Kimi 0.26 of the spread (its MoE amplifies
# activation rounding), fp16 about 0.03.
LOGITS_ATOL_FP32 = 1e-3
LOGITS_RTOL_FP16 = 2e-2
LOGITS_RTOL_INT8 = 3e-1


@dataclass(frozen=True)
class FamilySpec:
    architecture: str
    model_class: type[PreTrainedModel]

    def tiny_config(self, vocab_size: int, pad_token_id: int) -> PreTrainedConfig:
        raise NotImplementedError


class _Glm(FamilySpec):
    def tiny_config(self, vocab_size: int, pad_token_id: int) -> PreTrainedConfig:
        return Glm4Config(
            vocab_size=vocab_size,
            hidden_size=128,
            intermediate_size=384,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=DEFAULT_CONTEXT,
            pad_token_id=pad_token_id,
        )


# Sigmoid expert scores with the bias-corrected top-k: transformers' DeepSeek-V3 always routes so
# and Kimi-K2's published config says it; an engine that reads these fields (vLLM) routes the same
# way and loads the router's correction bias. (Not typed parameters of DeepseekV3Config.)
KIMI_ROUTING: dict[str, Any] = {"topk_method": "noaux_tc", "scoring_func": "sigmoid"}


class _Kimi(FamilySpec):
    def tiny_config(self, vocab_size: int, pad_token_id: int) -> PreTrainedConfig:
        # Kimi-K2's layout: multi-head latent attention (compressed KV cache) and a first dense
        # layer followed by MoE layers with routed + shared experts.
        return DeepseekV3Config(
            vocab_size=vocab_size,
            hidden_size=128,
            intermediate_size=384,
            moe_intermediate_size=64,
            num_hidden_layers=2,
            first_k_dense_replace=1,
            num_attention_heads=4,
            num_key_value_heads=4,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            **KIMI_ROUTING,
            # Kimi-K2's own latent and rope widths: the cache per token and the decode cost are
            # the real model's, and a peer engine (vLLM's MLA kernels take 512 + 64) loads it.
            kv_lora_rank=512,
            q_lora_rank=64,
            qk_rope_head_dim=64,
            qk_nope_head_dim=32,
            v_head_dim=32,
            max_position_embeddings=DEFAULT_CONTEXT,
            pad_token_id=pad_token_id,
            bos_token_id=None,
            eos_token_id=None,
        )


FAMILIES: dict[str, FamilySpec] = {
    "glm": _Glm("Glm4ForCausalLM", Glm4ForCausalLM),
    "kimi": _Kimi("DeepseekV3ForCausalLM", DeepseekV3ForCausalLM),
}


class _DecoderWithCache(torch.nn.Module):
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


def _prepare_for_export(model: PreTrainedModel) -> PreTrainedModel:
    # Eager attention and batched-matmul experts translate to plain ONNX ops; the default
    # grouped-experts path fails in the ONNX translation of torch 2.13.
    model.config._attn_implementation = "eager"
    model.config._experts_implementation = "batched_mm"
    for module in model.modules():
        if isinstance(module, deepseek_v3.DeepseekV3Attention):
            module.forward = types.MethodType(_absorbed_mla_forward, module)  # type: ignore[method-assign]
    return model.eval()


def _kv_layout(wrapper: _DecoderWithCache) -> KVCacheLayout:
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


def _export_graph(
    wrapper: _DecoderWithCache, layout: KVCacheLayout, path: Path, dtype: torch.dtype
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
            external_data=n_bytes > EXTERNAL_DATA_BYTES,
            verbose=False,
        )
    # Same weights, same bytes: drop the exporter's stack traces (absolute paths, line numbers).
    graph = onnx.load(str(path), load_external_data=False)
    strip_trace_metadata(graph)
    onnx.save(graph, str(path))


def _quantize_int8(path: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The exporter's recorded intermediate shapes trip the quantizer's own shape inference on
    # the batched MoE experts; it infers them afresh without them.
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


def default_model(family: Family, out: Path) -> tuple[PreTrainedModel, dict[str, Any]]:
    fmt = CHAT_FORMATS[family]
    tokenizer_info = save_tokenizer(build_tokenizer(fmt, DEFAULT_VOCAB_SIZE), fmt, out)
    config = FAMILIES[family].tiny_config(
        tokenizer_info["vocab_size"], tokenizer_info["pad_token_id"]
    )
    torch.manual_seed(SEED)
    model = FAMILIES[family].model_class(config)
    return model, tokenizer_info


def save_checkpoint(family: Family, out: Path) -> Path:
    """The seeded default as a PyTorch checkpoint (`save_pretrained` + its tokenizer), for a peer
    that serves the very weights our ONNX graph was exported from. Its config.json names the
    architecture and the chat format's end tokens, which a tiny random model's config lacks and
    an engine (vLLM) reads to load it and to stop."""
    out = fresh_dir(out)
    model, info = default_model(family, out)
    model.config.architectures = [FAMILIES[family].architecture]
    model.config.eos_token_id = info["eos_token_ids"]
    model.generation_config.eos_token_id = info["eos_token_ids"]
    model.save_pretrained(str(out))
    return out


def _checkpoint_model(family: Family, source: str, out: Path) -> tuple[PreTrainedModel, dict]:
    model = FAMILIES[family].model_class.from_pretrained(source, dtype=torch.float32)
    tokenizer: Any  # a fast tokenizer either way; transformers types the two apart
    if family == "kimi" and has_tiktoken_tokenizer(source):
        tokenizer = kimi_tokenizer(source)  # Kimi-K2 ships tiktoken.model, not tokenizer.json
    else:
        tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.save_pretrained(str(out))
    if not (out / "tokenizer.json").is_file():
        raise ValueError(f"{source}: only fast tokenizers (tokenizer.json) can be served")
    eos = model.generation_config.eos_token_id or tokenizer.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    info = {
        "eos_token_ids": eos_ids,
        "bos_token_id": tokenizer.bos_token_id,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        "special_tokens": dict(sorted(tokenizer.added_tokens_encoder.items())),
        "chat_template": tokenizer.chat_template,
        "vocab_size": model.config.vocab_size,
    }
    if not info["chat_template"]:
        raise ValueError(f"{source}: the tokenizer has no chat template")
    return model, info


def export_llm(
    family: Family,
    source: str | None,
    out: Path,
    *,
    dtype: Dtype = "fp32",
    quantize: Literal["int8"] | None = None,
    verify: bool = False,
    stages: Stages = NO_STAGES,
) -> ModelManifest:
    if family not in FAMILIES:
        raise ValueError(f"unknown chat family {family!r}; expected one of {sorted(FAMILIES)}")
    if dtype == "fp16" and quantize:
        raise ValueError("--dtype fp16 and --quantize int8 are alternatives; pick one")
    out = fresh_dir(out)
    with stages.stage("load"):
        if source is None:
            model, info = default_model(family, out)
        else:
            model, info = _checkpoint_model(family, source, out)
        model = _prepare_for_export(model)
        wrapper = _DecoderWithCache(model).eval()
        layout = _kv_layout(wrapper)
    graph = out / "model.onnx"
    with stages.stage("export"):
        # fp16 is exported from a half-precision model, so the graph keeps PyTorch's own upcasts
        # (norms, softmax) instead of a blind float32 -> float16 rewrite of every tensor.
        _export_graph(wrapper.to(TORCH_DTYPES[dtype]), layout, graph, TORCH_DTYPES[dtype])
        wrapper.to(torch.float32)  # --verify compares against the fp32 model
    if quantize == "int8":
        with stages.stage("quantise"):
            _quantize_int8(graph)
    (out / "config.json").write_text(model.config.to_json_string(use_diff=False))

    manifest = ModelManifest(
        name=family,
        task="chat",
        family=family,
        architecture=FAMILIES[family].architecture,
        source=source
        or f"embedded default: tiny {FAMILIES[family].architecture}, seed {SEED}, "
        f"{CHAT_DEFAULT_REVISION}",
        dtype=dtype,
        quantization=quantize,
        vocab_size=info["vocab_size"],
        llm=LLMSpec(
            context_length=int(model.config.max_position_embeddings),
            eos_token_ids=info["eos_token_ids"],
            bos_token_id=info["bos_token_id"],
            pad_token_id=info["pad_token_id"],
            chat_template=info["chat_template"],
            special_tokens=info["special_tokens"],
            kv_cache=layout,
        ),
    )
    manifest = manifest.write(out)
    if verify:
        with stages.stage("verify"):
            report = verify_llm(model, out, manifest)
        log.info("verified %s: %s", family, json.dumps(report))
    return manifest


def verify_llm(model: PreTrainedModel, model_dir: Path, manifest: ModelManifest) -> dict:
    """Compare the ONNX graph with the PyTorch model; raise VerificationError past tolerance."""
    assert manifest.llm is not None
    session = open_session(model_dir / manifest.graph, SessionConfig(provider="cpu"))
    graph = DecoderGraph(session, manifest.llm.kv_cache)
    vocab = manifest.vocab_size or model.config.vocab_size
    prompt = [int(t) for t in np.random.default_rng(SEED).integers(3, vocab, size=12)]

    with torch.no_grad():
        expected = model(input_ids=torch.tensor([prompt])).logits[0].float().numpy()
    actual = graph.full_logits(prompt).astype(np.float32)
    spread = float(np.max(np.abs(expected)))
    if manifest.quantization == "int8":
        tol = LOGITS_RTOL_INT8 * spread
    elif manifest.dtype == "fp16":
        tol = LOGITS_RTOL_FP16 * spread
    else:
        tol = LOGITS_ATOL_FP32
    report: dict[str, Any] = {"logits_max_abs_diff": check_close("logits", actual, expected, tol)}
    report["logits_tolerance"] = tol

    # KV-cached decoding must see what full recomputation sees: compare every step's logits on
    # the same continuation (teacher forcing), then the greedy tokens themselves.
    new_tokens = 16
    cached = graph.greedy_cached(prompt, new_tokens)
    stepwise = graph.cached_logits(prompt, cached[:-1])
    recomputed_rows = graph.full_logits(prompt + cached[:-1])[len(prompt) - 1 :]
    report["cached_vs_recompute_max_abs_diff"] = check_close(
        "KV-cached vs recomputed logits",
        stepwise.astype(np.float32),
        recomputed_rows.astype(np.float32),
        tol,
    )
    # int8 quantizes activations per tensor, so a one-token step and a whole sequence round
    # differently and near-ties may flip: token identity is only required without quantization.
    if manifest.quantization is None:
        recomputed = graph.greedy_full_recompute(prompt, new_tokens)
        if cached != recomputed:
            raise VerificationError(f"KV-cached greedy {cached} != full recompute {recomputed}")
    if manifest.dtype == "fp32" and manifest.quantization is None:
        with torch.no_grad():
            ids = list(prompt)
            for _ in range(new_tokens):
                ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
        if ids[len(prompt) :] != cached:
            raise VerificationError(f"ONNX greedy {cached} != PyTorch greedy {ids[len(prompt) :]}")
        report["greedy_tokens_match_pytorch"] = new_tokens

    # Ragged batch: sequences with different cache lengths decode in one step as they would alone.
    short = prompt[:5]
    alone = [graph.decode([7], [graph.prefill(p)[1]])[0][0] for p in (prompt, short)]
    together, _ = graph.decode([7, 7], [graph.prefill(prompt)[1], graph.prefill(short)[1]])
    for row, single in enumerate(alone):
        report[f"batched_row{row}_max_abs_diff"] = check_close(
            "batched decode", together[row].astype(np.float32), single.astype(np.float32), tol
        )
    report["transformers"] = transformers.__version__
    return report
