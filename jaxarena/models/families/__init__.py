"""Checkpoint families: a `Family` (`base`) maps a `config.json` to the decoder's blocks and
their HuggingFace tensor names; `registry.FAMILIES` maps `model_type` to its family
(`llama`/`mistral`, `qwen3`, `mamba2`, `nemotron_h`, `deepseek_v2`, `deepseek_v3`/`kimi_k2`)."""

from jaxarena.models.families.base import Family, TensorNames
from jaxarena.models.families.registry import FAMILIES, SUPPORTED_FAMILIES, family_for

__all__ = ["FAMILIES", "Family", "SUPPORTED_FAMILIES", "TensorNames", "family_for"]
