"""Pallas kernels that take their workspace from a jaxarena arena.

One folder per kernel: `kernel.py` (the kernel body), `ops.py` (the validating wrapper and the
arena form) and `reference.py` (an independent plain-`jnp` reference). With `interpret=None`
every kernel runs in interpret mode on a CPU backend and compiled on a GPU.
"""

from pallas_kernels.fp8_block_quant import (
    FP8_ACT_REGIONS,
    fp8_block_quant,
    fp8_block_quant_into,
    fp8_block_quant_reference,
)
from pallas_kernels.splitk_decode_attention import (
    SPLITK_ATTN_REGIONS,
    paged_decode_attention_reference,
    paged_decode_logits_reference,
    splitk_decode_attention,
    splitk_decode_attention_into,
    splitk_num_splits,
    splitk_slots_needed,
)
from pallas_kernels.ssd_chunked_scan import (
    ssd_chunked_reference,
    ssd_chunked_scan,
    ssd_chunked_scan_into,
    ssd_sequential_reference,
)

__all__ = [
    "FP8_ACT_REGIONS",
    "fp8_block_quant",
    "fp8_block_quant_into",
    "fp8_block_quant_reference",
    "SPLITK_ATTN_REGIONS",
    "paged_decode_attention_reference",
    "paged_decode_logits_reference",
    "splitk_decode_attention",
    "splitk_decode_attention_into",
    "splitk_num_splits",
    "splitk_slots_needed",
    "ssd_chunked_reference",
    "ssd_chunked_scan",
    "ssd_chunked_scan_into",
    "ssd_sequential_reference",
]
