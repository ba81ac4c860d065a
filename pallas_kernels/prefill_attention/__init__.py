"""Paged prefill attention: causal flash attention of packed variable-length prompts (and
chunked-prefill chunks) over a vLLM-layout paged KV cache, standalone or written in place
into the arena's `attn_output` region."""

from pallas_kernels.prefill_attention.ops import (
    paged_prefill_attention,
    paged_prefill_attention_into,
    prefill_blocks,
)
from pallas_kernels.prefill_attention.reference import paged_prefill_attention_reference

__all__ = [
    "paged_prefill_attention",
    "paged_prefill_attention_into",
    "paged_prefill_attention_reference",
    "prefill_blocks",
]
