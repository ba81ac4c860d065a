"""Decode's q/k RMSNorm + RoPE + K/V page write as one kernel (issue 39: fewer decode launches
per layer)."""

from pallas_kernels.qk_rope_kv_write.ops import (
    fused_write_unsupported,
    qk_rope_kv_write,
    qk_rope_kv_write_cost,
)
from pallas_kernels.qk_rope_kv_write.reference import qk_rope_kv_write_reference

__all__ = [
    "fused_write_unsupported",
    "qk_rope_kv_write",
    "qk_rope_kv_write_cost",
    "qk_rope_kv_write_reference",
]
