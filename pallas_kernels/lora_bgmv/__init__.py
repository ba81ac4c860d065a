"""Batched LoRA: every token multiplies its own adapter's A (shrink) and B (expand) weights,
tokens without an adapter (slot -1) get zeros (punica's BGMV / SGMV)."""

from pallas_kernels.lora_bgmv.arena import (
    LORA_XA_REGION,
    lora_expand_from_arena,
    lora_shrink_into,
)
from pallas_kernels.lora_bgmv.ops import lora_bgmv, lora_expand, lora_expand_into, lora_shrink
from pallas_kernels.lora_bgmv.reference import lora_bgmv_reference

__all__ = [
    "LORA_XA_REGION",
    "lora_bgmv",
    "lora_bgmv_reference",
    "lora_expand",
    "lora_expand_from_arena",
    "lora_expand_into",
    "lora_shrink",
    "lora_shrink_into",
]
