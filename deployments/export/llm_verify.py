"""`--verify`: an exported decoder graph against the PyTorch model it came from (logits, KV-cached
against recomputed decoding, greedy tokens, a ragged batch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from transformers import PreTrainedModel

from deployments.contracts.manifest import ModelManifest
from deployments.export.common import VerificationError, check_close
from deployments.export.llm_families import SEED
from deployments.replica.engine.decoder import DecoderGraph
from deployments.replica.engine.session import SessionConfig, open_session

# Parity tolerances of `--verify` against PyTorch fp32 logits, by what the graph was made into.
# fp32 differs only by kernel order; fp16 and int8 round weights, so they are judged relative to
# the logits' own spread, plus the cached-vs-recomputed token check inside the ONNX graph.
# Measured on the tiny defaults: int8 GLM 0.05 and Kimi 0.26 of the spread (its MoE amplifies
# activation rounding), fp16 about 0.03.
LOGITS_ATOL_FP32 = 1e-3
LOGITS_RTOL_FP16 = 2e-2
LOGITS_RTOL_INT8 = 3e-1


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
