"""FP8 e4m3 block-scaled activation quantization (DeepSeek-V3 1 x 128 groups)."""

from pallas_kernels.fp8_block_quant.ops import (
    FP8_ACT_REGIONS,
    SCALE_FORMATS,
    fp8_block_quant,
    fp8_block_quant_into,
)
from pallas_kernels.fp8_block_quant.reference import fp8_block_quant_reference

__all__ = [
    "FP8_ACT_REGIONS",
    "SCALE_FORMATS",
    "fp8_block_quant",
    "fp8_block_quant_into",
    "fp8_block_quant_reference",
]
