"""int8's greedy agreement, offline (no Ray): over a fixed prompt set, the fp32 graph's greedy
tokens, then the int8 graph teacher-forced along them: the share of positions where int8's
greedy pick equals fp32's (one early difference does not count against every later position)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.lib.corpus import benchmark_sentences
from deployments.contracts.manifest import ModelManifest
from deployments.export.fused_parity import open_session
from deployments.replica.engine.slot_decoder import SlotDecoder
from deployments.replica.engine.tokenizer import ChatTokenizer


def chat_tokenizer(model_dir: Path) -> ChatTokenizer:
    """The model's tokenizer and chat template, as its replica builds them."""
    manifest = ModelManifest.load(model_dir)
    assert manifest.llm is not None
    spec = manifest.llm
    return ChatTokenizer(
        model_dir / (manifest.tokenizer or "tokenizer.json"),
        spec.chat_template,
        spec.special_tokens,
        spec.eos_token_ids,
    )


def fixed_prompts(model_dir: Path, count: int) -> list[list[int]]:
    """`count` chat prompts (the corpus's first sentences), as the model's template renders them."""
    tokenizer = chat_tokenizer(model_dir)
    return [
        tokenizer.encode_chat([{"role": "user", "content": sentence}])
        for sentence in benchmark_sentences(count)
    ]


def _decoder(model_dir: Path, threads: int) -> SlotDecoder:
    manifest = ModelManifest.load(model_dir)
    assert manifest.llm is not None and manifest.vocab_size is not None
    return SlotDecoder(
        open_session(model_dir, manifest, threads),
        manifest.llm.kv_cache,
        manifest.vocab_size,
        slots=1,
        max_len=manifest.llm.context_length,
    )


def greedy_agreement(
    fp32_dir: Path, int8_dir: Path, prompts: int, tokens: int, threads: int
) -> dict[str, Any]:
    """Positions where int8's greedy token equals fp32's, over `prompts` prompts of `tokens`
    new tokens each."""
    prompt_ids = fixed_prompts(fp32_dir, prompts)
    reference = _decoder(fp32_dir, threads)
    fp32_tokens = []
    for ids in prompt_ids:
        slot, logits = reference.prefill(ids)
        picked = [int(np.argmax(logits))]
        for _ in range(tokens - 1):
            picked.append(int(np.argmax(reference.step([picked[-1]])[0])))
        reference.release(slot)
        fp32_tokens.append(picked)
    del reference
    quantised = _decoder(int8_dir, threads)
    equal: list[bool] = []
    for ids, picked in zip(prompt_ids, fp32_tokens, strict=True):
        slot, logits = quantised.prefill(ids)
        got = [int(np.argmax(logits))]
        got += [int(np.argmax(quantised.step([token])[0])) for token in picked[:-1]]
        quantised.release(slot)
        equal.extend(a == b for a, b in zip(got, picked, strict=True))
    return {
        "prompts": len(prompt_ids),
        "tokens_per_prompt": tokens,
        "positions": len(equal),
        "equal_share": round(sum(equal) / len(equal), 4),
    }
