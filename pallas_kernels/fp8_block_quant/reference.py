"""Plain-`jnp` float32 reference for FP8 block-scaled activation quantization.

Independent of the kernel: it imports nothing from this folder. It computes the correctly
rounded `amax / 448` by an exact residual correction where the kernel uses an IEEE division,
the power-of-two scale with `frexp`/`ldexp` where the kernel uses integer bit manipulation,
and the packed UE8M0 words with `frexp` exponents and integer products where the kernel uses
shifts, so a bug in either shows up as a mismatch in the bit-exact tests.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["fp8_block_quant_reference", "fp8_silu_mul_quant_reference"]


def _div448(a: jax.Array) -> jax.Array:
    """Correctly rounded f32 `a / 448` for `1e-4 <= a <= f32max`, without a division.

    `q0 = a * f32(1/448)` is within one ulp of the quotient; of `q0` and its two neighbours
    the correctly rounded one has the smallest residual `|a - 448 q|`. The residual is exact
    in f32, computed on `a * 2^-10` (exact: `a` is normal and far from the subnormal range,
    and the scaling keeps `512 q` finite): `448 q = 512 q - 64 q` with both products exact
    (powers of two), `a - 512 q` is exact by Sterbenz's lemma (`a / (512 q)` is about 7/8),
    and adding `64 q` (about `-(a - 512 q)`) is exact again. A tie cannot occur: it would need
    `a = 448 * (a 25-bit odd significand)`, which has more than 24 bits.
    """
    a = a.astype(jnp.float32)
    small = a * jnp.float32(2.0**-10)
    q0 = a * jnp.float32(1.0 / 448.0)
    # Optimization barriers keep XLA from fusing the candidates' products with the constants
    # (it would refactor them into `q * 448` or keep `q0` unrounded): each value is an f32.
    candidates = jax.lax.optimization_barrier(
        (jnp.nextafter(q0, jnp.float32(0)), q0, jnp.nextafter(q0, jnp.float32(jnp.inf)))
    )
    best, best_res = q0, None
    for q in candidates:
        qs = q * jnp.float32(2.0**-10)
        hi, lo = jax.lax.optimization_barrier((qs * jnp.float32(512.0), qs * jnp.float32(64.0)))
        res = jnp.abs((small - hi) + lo)
        if best_res is None:
            best, best_res = q, res
        else:
            better = res < best_res
            best, best_res = jnp.where(better, q, best), jnp.where(better, res, best_res)
    return best


def _align4(m: int) -> int:
    return -(-m // 4) * 4


def _quantize(xf: jax.Array, *, block_size: int, scale_format: str, scale_layout: str):
    m, k = xf.shape
    rows = m if scale_layout == "row" else _align4(m)
    num_blocks = -(-k // block_size)
    # Zero columns do not change max|x| of the last partial block; zero rows (past M, for the
    # column layouts) quantize to the floor scale.
    xb = jnp.pad(xf, ((0, rows - m), (0, num_blocks * block_size - k)))
    xb = xb.reshape(rows, num_blocks, block_size)
    amax = jnp.max(jnp.abs(xb), axis=-1)
    scale = _div448(jnp.maximum(amax, jnp.float32(1e-4)))
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
    q = y.astype(jnp.float8_e4m3fn).reshape(rows, num_blocks * block_size)[:m, :k]
    if scale_layout == "row":
        return q, scale
    if scale_layout == "col":
        return q, scale.T
    if scale_layout != "packed_ue8m0" or scale_format != "ue8m0":
        raise ValueError(f"{scale_layout=} with {scale_format=} is not a layout")
    # UE8M0 byte = the biased f32 exponent of the power of two 2**e = 0.5 * 2**(e + 1):
    # frexp gives e + 1, so the byte is e + 127 = frexp_exp + 126.
    _, fexp = jnp.frexp(scale)
    byte = (fexp + 126).astype(jnp.uint32)
    words_per_row = -(-num_blocks // 4)
    byte = jnp.pad(byte, ((0, 0), (0, 4 * words_per_row - num_blocks)))  # missing groups: 0
    byte = byte.reshape(rows, words_per_row, 4)
    weights = jnp.array([1, 256, 65536, 16777216], jnp.uint32)  # little endian
    words = jnp.sum(byte * weights, axis=-1, dtype=jnp.uint32)
    words = words.at[m:].set(0)  # padding tokens: 0 words (vLLM's packed quantizer)
    return q, jax.lax.bitcast_convert_type(words, jnp.int32).T


def fp8_block_quant_reference(
    x: jax.Array, *, block_size: int = 128, scale_format: str = "f32", scale_layout: str = "row"
) -> tuple[jax.Array, jax.Array]:
    """Quantizes `x` to FP8 e4m3 with one scale per row and per `block_size` columns.

    Args:
      x: `[M, K]` floating array. The last column block of a row is shorter when
        `K % block_size != 0`.
      block_size: columns per scale group.
      scale_format: `"f32"` (scale = max(amax, 1e-4) / 448, correctly rounded) or `"ue8m0"`
        (that scale rounded up to a power of two).
      scale_layout: `"row"` (`float32[M, nb]`), `"col"` (`float32[nb, align4(M)]`, rows past
        M quantized as zero rows) or `"packed_ue8m0"` (`int32[ceil(nb / 4), align4(M)]`: byte
        `b` of word `w` is the biased exponent of group `4w + b`, 0 past the last group;
        DeepGEMM's `get_mn_major_tma_aligned_packed_ue8m0_tensor` layout; the words of rows
        past M are 0, as vLLM's packed quantizer stores them).

    Returns:
      `(q, scales)`: `q` is `float8_e4m3fn[M, K]` with `q * scale ~ x`; `scales` as above.
    """
    xf = jnp.asarray(x).astype(jnp.float32)
    return _quantize(
        xf, block_size=block_size, scale_format=scale_format, scale_layout=scale_layout
    )


def fp8_silu_mul_quant_reference(
    gate: jax.Array,
    up: jax.Array,
    *,
    block_size: int = 128,
    scale_format: str = "f32",
    scale_layout: str = "row",
) -> tuple[jax.Array, jax.Array]:
    """`fp8_block_quant_reference(silu(gate) * up)` with the product kept in f32.

    `silu(g) = g * sigmoid(g) = g / (1 + exp(-g))`, evaluated in f32 from the inputs.
    """
    g = jnp.asarray(gate).astype(jnp.float32)
    a = g / (jnp.float32(1.0) + jnp.exp(-g)) * jnp.asarray(up).astype(jnp.float32)
    return _quantize(a, block_size=block_size, scale_format=scale_format, scale_layout=scale_layout)
