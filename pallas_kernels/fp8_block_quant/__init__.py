"""FP8 e4m3 block-scaled activation quantization (DeepSeek-V3 1 x 128 groups), plain and fused
with the gated MLP's `silu(gate) * up`; f32, column-major and packed UE8M0 scale layouts."""

from pallas_kernels.fp8_block_quant.ops import (
    BACKENDS,
    FFN_ACT_REGIONS,
    FP8_ACT_REGIONS,
    SCALE_FORMATS,
    SCALE_LAYOUTS,
    fp8_block_quant,
    fp8_block_quant_into,
    fp8_silu_mul_quant,
    fp8_silu_mul_quant_into,
)
from pallas_kernels.fp8_block_quant.reference import (
    fp8_block_quant_reference,
    fp8_silu_mul_quant_reference,
)

__all__ = [
    "BACKENDS",
    "FFN_ACT_REGIONS",
    "FP8_ACT_REGIONS",
    "SCALE_FORMATS",
    "SCALE_LAYOUTS",
    "fp8_block_quant",
    "fp8_block_quant_into",
    "fp8_block_quant_reference",
    "fp8_silu_mul_quant",
    "fp8_silu_mul_quant_into",
    "fp8_silu_mul_quant_reference",
]
