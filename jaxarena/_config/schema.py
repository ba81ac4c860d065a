"""The seed's `ModelConfig` schema as data: the integer fields with their defaults (spec §14.1)
and the HuggingFace layer-type strings with the kind each counts as. A leaf."""

from __future__ import annotations

__all__ = ["ATTENTION_KINDS", "SSM_KINDS", "OTHER_KINDS", "LAYER_TYPES", "INT_DEFAULTS"]

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
