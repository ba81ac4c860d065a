"""Split-K paged decode attention (vLLM KV-cache layout, GQA/MQA) filling the arena's
split-K workspace."""

from pallas_kernels.splitk_decode_attention.ops import (
    SPLITK_ATTN_REGIONS,
    splitk_decode_attention,
    splitk_decode_attention_into,
    splitk_num_splits,
    splitk_slots_needed,
)
from pallas_kernels.splitk_decode_attention.reference import (
    paged_decode_attention_reference,
    paged_decode_logits_reference,
)

__all__ = [
    "SPLITK_ATTN_REGIONS",
    "paged_decode_attention_reference",
    "paged_decode_logits_reference",
    "splitk_decode_attention",
    "splitk_decode_attention_into",
    "splitk_num_splits",
    "splitk_slots_needed",
]
