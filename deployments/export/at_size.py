"""The stand-ins at size (`python -m deployments.export large --out models-large`): GLM-4 and
Kimi-K2 checkpoints with the real models' layouts and vocabulary sizes, seeded random weights and
wide byte-level tokenizers built here, each saved with `save_pretrained` (so a peer engine serves
the very weights), then exported from that checkpoint by the command a real checkpoint uses.

One model at a time, and the PyTorch model is freed before the next: the build's peak memory is
the larger model's (GLM-4 fp32, 2.3 GB of weights) plus its export, not both families together.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedConfig, PreTrainedModel

from deployments.export.chat_tokenizer import CHAT_FORMATS, save_tokenizer
from deployments.export.common import fresh_dir
from deployments.export.llm_families import AT_SIZE_VOCAB, FAMILIES, SEED, Family, body_parameters
from deployments.export.wide_tokenizer import build_wide_tokenizer

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
# What `large` exports from each checkpoint: GLM-4 as the fused slot-cache graph (fp32 and int8
# MatMulNBits); Kimi-K2 through the plain path (MLA in the fused graph is a later phase).
LARGE_EXPORTS: tuple[tuple[Family, str, dict], ...] = (
    ("glm", "glm", {"attention": "fused"}),
    ("glm", "glm-int8", {"attention": "fused", "quantize": "int8"}),
    ("kimi", "kimi", {}),
)
# transformers leaves biases at 0 and norm weights at 1, which would hide a bias or a norm left
# out of a graph; the head's default spread gives near-tied logits, where greedy parity is luck.
BIAS_STD = 0.05
NORM_STD = 0.1
HEAD_STD = 0.1


def seeded_model(family: Family, config: PreTrainedConfig, seed: int = SEED) -> PreTrainedModel:
    """`config`'s model with seeded weights: transformers' init, then biases, norm weights and
    the head drawn from a second seeded generator (logits spread about +-15 at GLM's size)."""
    torch.manual_seed(seed)
    model = FAMILIES[family].model_class(config).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") and "correction" not in name:
                param.copy_(torch.randn(param.shape, generator=gen) * BIAS_STD)
            elif "norm" in name:
                param.copy_(1.0 + torch.randn(param.shape, generator=gen) * NORM_STD)
        head = model.get_output_embeddings().weight
        head.copy_(torch.randn(head.shape, generator=gen) * HEAD_STD)
    return model


def save_stand_in(family: Family, out: Path, layers: int | None = None) -> Path:
    """The at-size stand-in of `family` as a checkpoint directory (weights, config, tokenizer);
    `layers` cuts its depth (full width and vocabulary kept: a quick build for tests)."""
    out = fresh_dir(out)
    fmt = CHAT_FORMATS[family]
    info = save_tokenizer(build_wide_tokenizer(fmt, AT_SIZE_VOCAB[family]), fmt, out)
    config = FAMILIES[family].at_size_config(info["vocab_size"], info["pad_token_id"])
    if layers is not None:
        config.num_hidden_layers = layers
    config.architectures = [FAMILIES[family].architecture]
    config.eos_token_id = info["eos_token_ids"]
    model = seeded_model(family, config)
    model.generation_config.eos_token_id = info["eos_token_ids"]
    log.info(
        "%s stand-in: %.1fM parameters besides embedding and head",
        family,
        body_parameters(model) / 1e6,
    )
    model.save_pretrained(str(out))
    del model
    gc.collect()
    return out


def build_large(
    root: Path, layers: int | None = None, only: Sequence[str] | None = None
) -> list[Path]:
    """The stand-ins' checkpoints under root/checkpoints, their exports beside them: every
    export of LARGE_EXPORTS, or those `only` names (and only their families' checkpoints);
    `layers` cuts every model's depth (see save_stand_in)."""
    from deployments.export.llm import export_llm

    if layers is not None and layers < 1:
        raise ValueError(f"layers: {layers}; expected at least 1")
    exports = [e for e in LARGE_EXPORTS if only is None or e[1] in only]
    unknown = sorted(set(only or ()) - {name for _, name, _ in LARGE_EXPORTS})
    if unknown or not exports:
        names = [name for _, name, _ in LARGE_EXPORTS]
        raise ValueError(f"at-size exports {unknown or 'none'}: expected some of {names}")
    families = dict.fromkeys(family for family, _, _ in exports)
    checkpoints = {f: save_stand_in(f, root / CHECKPOINTS / f, layers) for f in families}
    built = []
    for family, name, options in exports:
        export_llm(family, str(checkpoints[family]), root / name, **options)
        gc.collect()
        built.append(root / name)
    return built
