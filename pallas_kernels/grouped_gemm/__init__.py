"""Dropless grouped GEMM (Triton backend): rows sorted by group times one weight per group,
walking a tile work list; bf16/f32 and block-FP8 (1 x 128 activations, 128 x 128 weights)."""

from pallas_kernels.grouped_gemm.arena import MOE_FP8_REGION, grouped_gemm_fp8_into
from pallas_kernels.grouped_gemm.ops import (
    FP8_BLOCK,
    grouped_gemm,
    grouped_gemm_fp8,
    max_work_items,
    work_list,
)
from pallas_kernels.grouped_gemm.reference import (
    fp8_moe_reference,
    grouped_gemm_reference,
)

__all__ = [
    "FP8_BLOCK",
    "MOE_FP8_REGION",
    "fp8_moe_reference",
    "grouped_gemm",
    "grouped_gemm_fp8",
    "grouped_gemm_fp8_into",
    "grouped_gemm_reference",
    "max_work_items",
    "work_list",
]
