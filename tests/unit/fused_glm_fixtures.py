"""A tiny GLM-4 checkpoint with seeded random biases and norms, exported as the fused slot-cache
graph: what the fused-export and slot-decoder tests run on (a second or two to build)."""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedModel

from deployments.contracts.manifest import ModelManifest
from deployments.export.at_size import seeded_model
from deployments.export.chat_tokenizer import CHAT_FORMATS, build_tokenizer, save_tokenizer
from deployments.export.llm import export_llm
from deployments.export.llm_families import DEFAULT_VOCAB_SIZE, FAMILIES


def tiny_glm_checkpoint(out: Path) -> tuple[PreTrainedModel, Path]:
    fmt = CHAT_FORMATS["glm"]
    info = save_tokenizer(build_tokenizer(fmt, DEFAULT_VOCAB_SIZE), fmt, out)
    config = FAMILIES["glm"].tiny_config(info["vocab_size"], info["pad_token_id"])
    model = seeded_model("glm", config)
    model.save_pretrained(str(out))
    return model, out


def export_fused(checkpoint: Path, out: Path, quantize: str | None = None) -> ModelManifest:
    return export_llm("glm", str(checkpoint), out, attention="fused", quantize=quantize)  # type: ignore[arg-type]
