"""The seed's `ModelConfig` schema as data: the integer fields with their defaults (spec §14.1)
and the HuggingFace layer-type strings with the kind each counts as. A leaf."""

from __future__ import annotations

__all__ = [
    "ATTENTION_KINDS",
    "SSM_KINDS",
    "OTHER_KINDS",
    "LAYER_TYPES",
    "INT_DEFAULTS",
    "INT_MAXIMA",
]

# HuggingFace layer-type strings we accept, and what each counts as. The seed's enum has five
# kinds; the other spellings are the ones published configs use for the same things (`mamba` is
# what Nemotron-H's `M` and Jamba's mamba layers are; the seed files them as linear attention).
ATTENTION_KINDS = frozenset(
    {
        "full_attention",
        "sliding_attention",
        "chunked_attention",
        "sparse_attention",
        "deepseek_sparse_attention",
        "attention",
    }
)
SSM_KINDS = frozenset({"linear_attention", "mamba"})
OTHER_KINDS = frozenset({"moe", "mlp"})
LAYER_TYPES: frozenset[str] = ATTENTION_KINDS | SSM_KINDS | OTHER_KINDS

# Integer fields with the seed's defaults (spec §14.1), in the seed's order.
INT_DEFAULTS: dict[str, int] = {
    "num_hidden_layers": 0,
    "intermediate_size": 0,
    "vocab_size": 0,
    "num_attention_heads": 0,
    "num_key_value_heads": 0,
    "head_dim": 0,
    "linear_num_key_heads": 0,
    "linear_key_head_dim": 0,
    "linear_num_value_heads": 0,
    "linear_value_head_dim": 0,
    "num_experts": 0,
    "zero_expert_num": 0,
    "num_experts_per_tok": 1,
    "moe_intermediate_size": 0,
    "shared_expert_intermediate_size": 0,
    "moe_latent_size": 0,
    "full_attention_interval": 1,
    "mamba_num_heads": 0,
    "mamba_head_dim": 0,
    "ssm_state_size": 0,
    "n_groups": 0,
    "kv_lora_rank": 0,
    "q_lora_rank": 0,
    "qk_rope_head_dim": 0,
    "o_lora_rank": 0,
    "o_groups": 0,
    "hc_mult": 0,
    "hc_lowrank": 0,
    "index_n_heads": 0,
    "index_head_dim": 0,
    "index_topk": 0,
    "index_compress_ratio": 0,
    "adapter_max_rank": 0,
}

# The sane range of every integer `ModelConfig` field: `0 <= value <= INT_MAXIMA[name]`
# (`hidden_size` also >= 1). A value past its maximum is a corrupt or mistyped config, not a
# model: each bound is at least 16x the largest published value (hidden 25,600 -> 2^20; vocab
# 262,144 -> 2^24; layers a few hundred -> 2^16; experts 512 -> 2^16; head dims 512 -> 2^14;
# FFN widths 53,248 -> 2^22; parameter counts ~2^40 -> 2^48), and keeps every size the sizing
# derives an exact, float-printable int. `ConfigError` names the field and its bound.
_WIDTH = 1 << 22  # FFN / inner widths
_HEADS = 1 << 14  # head counts and per-head widths
_COUNT = 1 << 16  # layers, experts, intervals, ranks of adapters
INT_MAXIMA: dict[str, int] = {
    "hidden_size": 1 << 20,
    "num_hidden_layers": _COUNT,
    "intermediate_size": _WIDTH,
    "vocab_size": 1 << 24,
    "num_attention_heads": _HEADS,
    "num_key_value_heads": _HEADS,
    "head_dim": _HEADS,
    "linear_num_key_heads": _HEADS,
    "linear_key_head_dim": _HEADS,
    "linear_num_value_heads": _HEADS,
    "linear_value_head_dim": _HEADS,
    "num_experts": _COUNT,
    "zero_expert_num": _COUNT,
    "num_experts_per_tok": _COUNT,
    "moe_intermediate_size": _WIDTH,
    "shared_expert_intermediate_size": _WIDTH,
    "moe_latent_size": 1 << 20,
    "full_attention_interval": _COUNT,
    "mamba_num_heads": _HEADS,
    "mamba_head_dim": _HEADS,
    "ssm_state_size": _HEADS,
    "n_groups": _HEADS,
    "kv_lora_rank": 1 << 20,
    "q_lora_rank": 1 << 20,
    "qk_rope_head_dim": _HEADS,
    "o_lora_rank": 1 << 20,
    "o_groups": _HEADS,
    "hc_mult": _COUNT,
    "hc_lowrank": 1 << 20,
    "index_n_heads": _HEADS,
    "index_head_dim": _HEADS,
    "index_topk": 1 << 24,
    "index_compress_ratio": _COUNT,
    "adapter_max_rank": _COUNT,
    # weight-only fields (jaxarena._config.hf_weights)
    "v_head_dim": _HEADS,
    "sliding_window": 1 << 30,
    "conv_kernel": 1 << 10,
    "mamba1_d_inner": _WIDTH,
    "mamba1_d_state": _HEADS,
    "mamba1_dt_rank": 1 << 20,
    "num_mtp_layers": _COUNT,
    "vision_param_count": 1 << 48,
    "other_param_count": 1 << 48,
    "max_position_embeddings": 1 << 40,
}
