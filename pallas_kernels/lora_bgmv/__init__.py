"""Batched LoRA: every token multiplies its own adapter's A (shrink) and B (expand) weights,
tokens without an adapter (slot -1) get zeros (punica's BGMV / SGMV)."""

from pallas_kernels.lora_bgmv.ops import lora_bgmv, lora_expand, lora_expand_into, lora_shrink
from pallas_kernels.lora_bgmv.reference import lora_bgmv_reference

__all__ = [
    "lora_bgmv",
    "lora_bgmv_reference",
    "lora_expand",
    "lora_expand_into",
    "lora_shrink",
]
