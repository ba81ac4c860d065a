"""Gemma 3's vision tower in the weight budget, as the Qwen-VL towers are.

The expected counts are transformers' (Gemma3ForConditionalGeneration built on the meta
device from this config, transformers 5.24): 421,290,864 parameters in `vision_tower` and
`multi_modal_projector`, 11,766,034,176 in `language_model`.
"""

from __future__ import annotations

from jaxarena import ModelConfig
from jaxarena._sizing import weights as W

# google/gemma-3-12b-it's config.json (the keys that size the model).
GEMMA3_12B = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "mm_tokens_per_image": 256,
    "text_config": {
        "hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
        "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
        "head_dim": 256, "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024, "query_pre_attn_scalar": 256, "vocab_size": 262208,
    },
    "vision_config": {
        "hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
        "model_type": "siglip_vision_model", "num_attention_heads": 16,
        "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False,
    },
}  # fmt: skip


def test_gemma3_12b_vision_tower_and_text_counts_equal_transformers():
    config = ModelConfig.from_hf(GEMMA3_12B)
    assert config.vision_param_count == 421_290_864
    parts = W.param_breakdown(config)
    assert parts["vision"] == 421_290_864
    assert W.param_count(config) - parts["vision"] == 11_766_034_176


def test_text_only_gemma3_has_no_vision_tower():
    text = {**GEMMA3_12B["text_config"], "architectures": ["Gemma3ForCausalLM"]}
    assert ModelConfig.from_hf(text).vision_param_count == 0
