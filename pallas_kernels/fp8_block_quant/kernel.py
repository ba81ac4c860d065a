"""Kernel body: one row tile by one column block of FP8 block-scaled quantization.

Each grid step reads `x[rows, block]`, computes one scale per row from the block's max |x|,
and writes the e4m3 bits (as `uint8`) and the scales. Padding, block shapes and the grid
live in `ops.py`; this file holds the algorithm only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu

__all__ = ["AMAX_FLOOR", "FP8_E4M3_MAX", "fp8_block_quant_kernel"]

# e4m3fn's largest finite value; the scale maps a block's max |x| onto it.
FP8_E4M3_MAX = 448.0
# Floor on max |x| so an all-zero block gets a finite, non-zero scale.
AMAX_FLOOR = 1e-4
# Why products and one reciprocal instead of two divisions: XLA's algebraic simplifier
# rewrites `a / 448` into `a * f32(1/448)` and `x / broadcast(s)` into `x * broadcast(1/s)`,
# so that is what any jnp code (the reference, interpret mode) computes for "amax / 448" and
# "x / scale". Writing the products explicitly makes the compiled Triton kernel compute the
# same bits. For ue8m0 scales 1/scale is a power of two and x * (1/scale) == x / scale exactly.
_INV_FP8_E4M3_MAX = 1.0 / FP8_E4M3_MAX

# ue8m0 rounding of a positive normal f32 `s` up to a power of two, on its bits: adding
# 2**23 - 1 carries into the exponent exactly when the mantissa field is non-zero, and the mask
# then drops the mantissa. The scale is at least 1e-4 / 448 (normal) and at most
# f32max / 448, so the exponent never reaches the inf pattern and the sign bit stays 0 (int32
# arithmetic cannot overflow).
_MANTISSA_ONES = 0x007FFFFF
_EXPONENT_MASK = 0x7F800000


def _reciprocal(den: jax.Array, *, ptx_reciprocal: bool) -> jax.Array:
    """Correctly rounded f32 `1 / den`.

    Triton lowers `/` on f32 to PTX `div.full.f32` (up to 2 ulp off), which would change the
    e4m3 rounding of values next to a rounding boundary; `rcp.rn.f32` is the IEEE reciprocal
    XLA computes, so compiled and reference results agree bit for bit. Interpret mode runs on
    XLA, whose `1 / den` is already correctly rounded.
    """
    if not ptx_reciprocal:
        return 1.0 / den
    [out] = plgpu.elementwise_inline_asm(
        "rcp.rn.f32 $0, $1;",
        args=[den],
        constraints="=f,f",
        pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(den.shape, jnp.float32)],
    )
    return out


def fp8_block_quant_kernel(
    x_ref,
    q_ref,
    scale_ref,
    *,
    scale_format: str,
    ptx_reciprocal: bool,
) -> None:
    """Quantizes one `[rows, block]` tile.

    Refs: `x_ref` `[rows, block]` (bf16/f16/f32), `q_ref` `[rows, block]` `uint8` (the e4m3fn
    bits), `scale_ref` `[rows, 1]` `float32`. Zero columns (padding) leave max |x| unchanged.

    Static: `scale_format` is `"f32"` or `"ue8m0"`; `ptx_reciprocal` selects the PTX IEEE reciprocal
    (compiled CUDA) instead of `1 / s` (interpret mode).
    """
    x = x_ref[...].astype(jnp.float32)
    amax = jnp.max(jnp.abs(x), axis=1, keepdims=True)
    scale = jnp.maximum(amax, AMAX_FLOOR) * _INV_FP8_E4M3_MAX
    if scale_format == "ue8m0":
        bits = jax.lax.bitcast_convert_type(scale, jnp.int32)
        bits = (bits + _MANTISSA_ONES) & _EXPONENT_MASK
        scale = jax.lax.bitcast_convert_type(bits, jnp.float32)
    y = x * _reciprocal(scale, ptx_reciprocal=ptx_reciprocal)
    # The f32 -> e4m3fn conversion does not saturate on every backend (NaN beyond 464 on the
    # CPU), and x / scale can exceed 448 by the f32 roundings of the scale: clamp explicitly.
    y = jnp.clip(y, -FP8_E4M3_MAX, FP8_E4M3_MAX)
    q_ref[...] = jax.lax.bitcast_convert_type(y.astype(jnp.float8_e4m3fn), jnp.uint8)
    scale_ref[...] = scale
