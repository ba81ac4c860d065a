"""Plain-`jnp` float32 reference for FP8 block-scaled activation quantization.

Independent of the kernel: it imports nothing from this folder and computes the
power-of-two scale with `frexp`/`ldexp` where the kernel uses integer bit manipulation, so
a bug in either shows up as a mismatch in the bit-exact tests.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["fp8_block_quant_reference"]


def fp8_block_quant_reference(
    x: jax.Array, *, block_size: int = 128, scale_format: str = "f32"
) -> tuple[jax.Array, jax.Array]:
    """Quantizes `x` to FP8 e4m3 with one scale per row and per `block_size` columns.

    Args:
      x: `[M, K]` floating array. The last column block of a row is shorter when
        `K % block_size != 0`.
      block_size: columns per scale group.
      scale_format: `"f32"` (scale = max(amax, 1e-4) / 448) or `"ue8m0"` (that scale rounded
        up to a power of two).

    Returns:
      `(q, scales)`: `q` is `float8_e4m3fn[M, K]` with `q * scale ~ x`; `scales` is
      `float32[M, ceil(K / block_size)]`.
    """
    m, k = x.shape
    num_blocks = -(-k // block_size)
    xf = jnp.asarray(x).astype(jnp.float32)
    # Zero columns do not change max|x| of the last partial block.
    xb = jnp.pad(xf, ((0, 0), (0, num_blocks * block_size - k))).reshape(m, num_blocks, block_size)
    amax = jnp.max(jnp.abs(xb), axis=-1)
    # Spelled as XLA evaluates `amax / 448` and `x / scale` (it rewrites a division by a
    # constant or a broadcast into a product with the reciprocal), so the result does not
    # depend on whether the simplifier ran.
    scale = jnp.maximum(amax, jnp.float32(1e-4)) * jnp.float32(1.0 / 448.0)
    if scale_format == "ue8m0":
        # scale = mant * 2**exp with mant in [0.5, 1); ceil(log2(scale)) is exp, or exp - 1 when
        # scale is already a power of two (mant == 0.5). frexp and ldexp are exact.
        mant, exp = jnp.frexp(scale)
        exp = jnp.where(mant == 0.5, exp - 1, exp)
        scale = jnp.ldexp(jnp.ones_like(scale), exp)
    elif scale_format != "f32":
        raise ValueError(f"{scale_format=} must be 'f32' or 'ue8m0'")
    y = xb * (jnp.float32(1.0) / scale)[:, :, None]
    # Explicit saturation: the f32 -> e4m3fn conversion gives NaN, not 448, beyond the range.
    y = jnp.clip(y, -448.0, 448.0)
    q = y.astype(jnp.float8_e4m3fn).reshape(m, num_blocks * block_size)[:, :k]
    return q, scale
