"""Kernel arithmetic of FP8 block-scaled quantization, shared by the standalone and arena kernels.

Per row and `block_size` columns: `amax = max|x|` (f32), `scale = max(amax, 1e-4) / 448` by a
correctly rounded division (`"ue8m0"`: then rounded up to a power of two), and
`q = e4m3fn(clamp(x * (1 / scale), -448, 448))`. The fused gated-MLP form first computes
`x = silu(gate) * up` in f32. Grids, block shapes and addressing live in `ops.py`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import triton as plgpu

__all__ = [
    "AMAX_FLOOR",
    "FP8_E4M3_MAX",
    "activation",
    "block_scale",
    "fp8_block_quant_kernel",
    "quantize_bits",
    "reciprocal",
    "row_tile",
    "MAX_TILE_ELEMENTS",
]

# Triton tiles must be powers of two; the widest tile we compile is this many elements, which
# bounds the block width (a tile of one row) and sets the row tile (8192 / width, at most 64).
MAX_TILE_ELEMENTS = 8192
_MAX_ROW_TILE = 64
# e4m3fn's largest finite value; the scale maps a block's max |x| onto it.
FP8_E4M3_MAX = 448.0
# Floor on max |x| so an all-zero block gets a finite, non-zero scale.
AMAX_FLOOR = 1e-4

# ue8m0 rounding of a positive normal f32 `s` up to a power of two, on its bits: adding
# 2**23 - 1 carries into the exponent exactly when the mantissa field is non-zero, and the mask
# then drops the mantissa. The scale is at least 1e-4 / 448 (normal) and at most
# f32max / 448, so the exponent never reaches the inf pattern and the sign bit stays 0 (int32
# arithmetic cannot overflow).
_MANTISSA_ONES = 0x007FFFFF
_EXPONENT_MASK = 0x7F800000


def _asm(code: str, *args: jax.Array) -> jax.Array:
    constraints = "=f," + ",".join("f" for _ in args)
    [out] = plgpu.elementwise_inline_asm(
        code,
        args=list(args),
        constraints=constraints,
        pack=1,
        result_shape_dtypes=[jax.ShapeDtypeStruct(args[0].shape, jnp.float32)],
    )
    return out


def reciprocal(den: jax.Array, *, ptx: bool) -> jax.Array:
    """Correctly rounded f32 `1 / den`.

    Triton lowers `/` on f32 to PTX `div.full.f32` (up to 2 ulp off), which would change the
    e4m3 rounding of values next to a rounding boundary; `rcp.rn.f32` is the IEEE reciprocal
    XLA computes, so compiled and reference results agree bit for bit. Interpret mode runs on
    XLA, whose `1 / den` is already correctly rounded; the barrier keeps its simplifier from
    rewriting `1 / (a / b)` into `b / a` when `den` is itself a quotient.
    """
    if not ptx:
        return 1.0 / jax.lax.optimization_barrier(den)
    return _asm("rcp.rn.f32 $0, $1;", den)


def _divide_by_448(a: jax.Array, *, ptx: bool) -> jax.Array:
    """Correctly rounded f32 `a / 448` (the PyTorch/Triton peers' `amax / 448.0`).

    Neither backend divides when asked plainly: XLA's algebraic simplifier rewrites a division
    by a constant or a broadcast into a product with the reciprocal (`a * f32(1/448)` differs
    from `a / 448` in about half the values), and Triton emits the approximate
    `div.full.f32`. Compiled: PTX `div.rn.f32`. Interpret mode: the divisor is a full array
    behind an optimization barrier, which XLA cannot see as a constant, so it divides (IEEE).
    """
    if ptx:
        return _asm("div.rn.f32 $0, $1, $2;", a, jnp.full(a.shape, FP8_E4M3_MAX, jnp.float32))
    den = jax.lax.optimization_barrier(jnp.full(a.shape, FP8_E4M3_MAX, jnp.float32))
    return a / den


def block_scale(amax: jax.Array, *, scale_format: str, ptx: bool) -> jax.Array:
    """`max(amax, 1e-4) / 448` correctly rounded; `"ue8m0"`: rounded up to a power of two."""
    scale = _divide_by_448(jnp.maximum(amax, AMAX_FLOOR), ptx=ptx)
    if scale_format == "ue8m0":
        bits = jax.lax.bitcast_convert_type(scale, jnp.int32)
        bits = (bits + _MANTISSA_ONES) & _EXPONENT_MASK
        scale = jax.lax.bitcast_convert_type(bits, jnp.float32)
    return scale


def activation(gate: jax.Array, up: jax.Array | None) -> jax.Array:
    """`gate` as f32, or `silu(gate) * up` (f32, no intermediate rounding) when `up` is given."""
    g = gate.astype(jnp.float32)
    if up is None:
        return g
    return g / (1.0 + jnp.exp(-g)) * up.astype(jnp.float32)


def quantize_bits(x: jax.Array, inv_scale: jax.Array) -> jax.Array:
    """e4m3fn bits (`uint8`) of `clamp(x * inv_scale, -448, 448)`, round to nearest even."""
    # The f32 -> e4m3fn conversion does not saturate on every backend (NaN beyond 464 on the
    # CPU), and x / scale can exceed 448 by the f32 roundings of the scale: clamp explicitly.
    y = jnp.clip(x * inv_scale, -FP8_E4M3_MAX, FP8_E4M3_MAX)
    return jax.lax.bitcast_convert_type(y.astype(jnp.float8_e4m3fn), jnp.uint8)


def fp8_block_quant_kernel(*refs, scale_format: str, ptx: bool, fused: bool) -> None:
    """Quantizes one `[rows, block]` tile (the standalone form's kernel).

    Refs: `x_ref` (and `up_ref` when `fused`) `[rows, block]` bf16/f16/f32, then `q_ref`
    `[rows, block]` `uint8` (the e4m3fn bits) and `scale_ref` `[rows, 1]` `float32`. Zero
    columns (padding) leave max |x| unchanged (silu(0) * 0 = 0 as well).

    Static: `scale_format` is `"f32"` or `"ue8m0"`; `ptx` selects the PTX IEEE division and
    reciprocal (compiled CUDA) instead of their XLA spellings (interpret mode).
    """
    if fused:
        x_ref, up_ref, q_ref, scale_ref = refs
        x = activation(x_ref[...], up_ref[...])
    else:
        x_ref, q_ref, scale_ref = refs
        x = activation(x_ref[...], None)
    amax = jnp.max(jnp.abs(x), axis=1, keepdims=True)
    scale = block_scale(amax, scale_format=scale_format, ptx=ptx)
    q_ref[...] = quantize_bits(x, reciprocal(scale, ptx=ptx))
    scale_ref[...] = scale


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def row_tile(m: int, block_width: int) -> int:
    """Rows per grid step: a power of two; one that divides `m` when possible (no padding)."""
    cap = min(_MAX_ROW_TILE, MAX_TILE_ELEMENTS // block_width)
    tile = cap
    while tile >= 16:
        if m % tile == 0:
            return tile
        tile //= 2
    return min(cap, _next_pow2(m))
