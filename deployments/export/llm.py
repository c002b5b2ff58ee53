"""GLM-4 and Kimi-K2 (DeepSeek-V3 layout) checkpoints -> KV-cache decoder ONNX model directories.

The same code exports a real checkpoint (`--from <HF id or dir>`) or the embedded default: the real
`transformers` architecture at tiny size with deterministic random weights and a locally built
tokenizer. Decoder graphs take and return the KV cache, so decoding never recomputes the prefix:
the plain `torch.onnx` graph (`llm_torch_graph`), or for GLM-4 the fused slot-cache graph
(`--attention fused`, `fused_glm`) with MatMulNBits weights (`nbits`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Literal, cast

import torch
from transformers import AutoTokenizer, Glm4Config, PreTrainedModel

from deployments.contracts.manifest import LLMSpec, ModelManifest, Quantization
from deployments.export.chat_tokenizer import CHAT_FORMATS, build_tokenizer, save_tokenizer
from deployments.export.common import fresh_dir
from deployments.export.llm_families import DEFAULT_VOCAB_SIZE, FAMILIES, SEED, Family
from deployments.export.llm_torch_graph import (
    DecoderWithCache,
    export_graph,
    kv_layout,
    prepare_for_export,
    quantize_int8,
)
from deployments.export.llm_verify import verify_llm
from deployments.export.progress import NO_STAGES, Stages
from deployments.export.revisions import CHAT_DEFAULT_REVISION
from deployments.export.tiktoken_tokenizer import has_tiktoken_tokenizer, kimi_tokenizer

log = logging.getLogger(__name__)

Dtype = Literal["fp32", "fp16"]
Attention = Literal["plain", "fused"]
TORCH_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}

__all__ = ["default_model", "export_llm", "save_checkpoint", "verify_llm"]


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
    quantize: Quantization | None = None,
    attention: Attention = "plain",
    verify: bool = False,
    stages: Stages = NO_STAGES,
) -> ModelManifest:
    if family not in FAMILIES:
        raise ValueError(f"unknown chat family {family!r}; expected one of {sorted(FAMILIES)}")
    if dtype == "fp16" and quantize:
        raise ValueError(f"--dtype fp16 and --quantize {quantize} are alternatives; pick one")
    if attention == "fused" and (family != "glm" or dtype != "fp32"):
        raise ValueError("--attention fused builds GLM-4 in fp32 (or --quantize int8|int4) only")
    if attention == "plain" and quantize == "int4":
        raise ValueError("--quantize int4 is MatMulNBits, built with --attention fused")
    out = fresh_dir(out)
    with stages.stage("load"):
        if source is None:
            model, info = default_model(family, out)
        else:
            model, info = _checkpoint_model(family, source, out)
        model = prepare_for_export(model)
    graph = out / "model.onnx"
    prepacked = None
    if attention == "fused":
        from deployments.export import fused_glm, nbits

        with stages.stage("export"):
            fused_glm.build_fused_glm(model, graph)
            layout = fused_glm.slot_cache_layout(cast(Glm4Config, model.config))
        if quantize:
            with stages.stage("quantise"):
                nbits.quantize_matmul_nbits(graph, quantize)
        with stages.stage("prepack"):
            prepacked = nbits.save_cpu_prepacked(graph).name
    else:
        wrapper = DecoderWithCache(model).eval()
        layout = kv_layout(wrapper)
        with stages.stage("export"):
            # fp16 is exported from a half-precision model, so the graph keeps PyTorch's own
            # upcasts (norms, softmax) instead of a blind float32 -> float16 rewrite of all.
            export_graph(wrapper.to(TORCH_DTYPES[dtype]), layout, graph, TORCH_DTYPES[dtype])
            wrapper.to(torch.float32)  # --verify compares against the fp32 model
        if quantize == "int8":
            with stages.stage("quantise"):
                quantize_int8(graph)
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
        cpu_prepacked_graph=prepacked,
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
            if attention == "fused":
                from deployments.export.fused_parity import verify_fused

                report = verify_fused(model, out, manifest)
            else:
                report = verify_llm(model, out, manifest)
        log.info("verified %s: %s", family, json.dumps(report))
    return manifest
