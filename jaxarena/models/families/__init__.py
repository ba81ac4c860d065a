"""Checkpoint families: a `Family` (`base`) maps a `config.json` to the decoder's blocks and
their HuggingFace tensor names; `registry.FAMILIES` maps `model_type` to its family
(`llama`/`mistral`, `qwen2`, `qwen3`, `gemma2`/`gemma3_text`/`gemma3`, `mamba2`, `nemotron_h`,
`qwen3_5`/`qwen3_5_text`, `qwen3_next`, `deepseek_v2`, `deepseek_v3`/`kimi_k2`)."""

from jaxarena.models.families.base import Family, TensorNames
from jaxarena.models.families.registry import FAMILIES, SUPPORTED_FAMILIES, family_for

__all__ = ["FAMILIES", "Family", "SUPPORTED_FAMILIES", "TensorNames", "family_for"]
