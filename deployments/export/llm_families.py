"""The two chat families' architectures and sizes: the tiny defaults (`make models`, seconds to
build) and the stand-ins at size (`python -m deployments.export large`), both built from the real
`transformers` classes so a peer engine loads the same checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Glm4Config,
    Glm4ForCausalLM,
    PreTrainedConfig,
    PreTrainedModel,
)

Family = Literal["glm", "kimi"]

SEED = 0
DEFAULT_VOCAB_SIZE = 4096
DEFAULT_CONTEXT = 2048
# The real vocabularies (GLM-4-9B: 151,552; Kimi-K2: 163,840): the head, sampling, logprobs and
# grammar masks run at the width users serve.
AT_SIZE_VOCAB = {"glm": 151_552, "kimi": 163_840}
AT_SIZE_CONTEXT = 4096


@dataclass(frozen=True)
class FamilySpec:
    architecture: str
    model_class: type[PreTrainedModel]

    def tiny_config(self, vocab_size: int, pad_token_id: int) -> PreTrainedConfig:
        raise NotImplementedError

    def at_size_config(self, vocab_size: int, pad_token_id: int) -> PreTrainedConfig:
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

    def at_size_config(self, vocab_size: int, pad_token_id: int) -> PreTrainedConfig:
        # GLM-4-9B's layout at a width this CPU serves: 32 query heads over 2 KV heads (9B's
        # ratio), head_dim 64 with rotary on its first half (interleaved), q/k/v bias, four
        # RMSNorms per layer. 18 layers x 17.0M = 306M parameters besides the embedding and the
        # head (135.8M each); 9B has 40 layers of 4,096 (32 x 128 heads) and 13,696.
        return Glm4Config(
            vocab_size=vocab_size,
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=18,
            num_attention_heads=32,
            num_key_value_heads=2,
            head_dim=64,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10_000.0,
                "partial_rotary_factor": 0.5,
            },
            rms_norm_eps=1.5625e-07,
            attention_bias=True,
            tie_word_embeddings=False,
            max_position_embeddings=AT_SIZE_CONTEXT,
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

    def at_size_config(self, vocab_size: int, pad_token_id: int) -> PreTrainedConfig:
        # Kimi-K2's layout (DeepSeek-V3) narrowed: its per-head widths (latent 512 + rope 64,
        # nope 128, value 128), one dense layer then MoE layers of many small routed experts with
        # top-8 sigmoid routing and one shared expert. 7 layers, hidden 1,024, 16 heads, 64
        # experts of 256: 361M parameters besides the embedding and the head (168M each), about
        # 100M active per token. K2: 61 layers of 7,168, 64 heads, 384 experts of 2,048.
        return DeepseekV3Config(
            vocab_size=vocab_size,
            hidden_size=1024,
            intermediate_size=2816,
            moe_intermediate_size=256,
            num_hidden_layers=7,
            first_k_dense_replace=1,
            num_attention_heads=16,
            num_key_value_heads=16,
            n_routed_experts=64,
            num_experts_per_tok=8,
            n_shared_experts=1,
            n_group=1,
            topk_group=1,
            routed_scaling_factor=2.827,
            **KIMI_ROUTING,
            kv_lora_rank=512,
            q_lora_rank=384,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            max_position_embeddings=AT_SIZE_CONTEXT,
            pad_token_id=pad_token_id,
            bos_token_id=None,
            eos_token_id=None,
        )


FAMILIES: dict[str, FamilySpec] = {
    "glm": _Glm("Glm4ForCausalLM", Glm4ForCausalLM),
    "kimi": _Kimi("DeepseekV3ForCausalLM", DeepseekV3ForCausalLM),
}


def body_parameters(model: PreTrainedModel) -> int:
    """Parameters besides the input embedding and the output head: what the issue's size counts."""
    skip = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)
