"""FP8 block quantization and block-scaled products in plain XLA: the `kernels="xla"` path of
`linear` (the `fp8_block_quant` kernel and `fp8_block_matmul`) and of the MoE's FP8 grouped
GEMM (`core.xla_moe`).

Semantics of the kernels (`pallas_kernels.fp8_block_quant` module docstring): 1 x 128 groups
per row, `amax = max|x|` in f32, `scale = max(amax, 1e-4) / 448` (a correctly rounded f32 division,
as the kernel's), `q = e4m3fn(clip(x * (1 / scale), -448, 448))`. The products are
`sum_b xs[t, b] * ws[n // 128, b] * (xq[t, blk b] . w[n, blk b])`: here the two operands
are dequantized (`xq * xs`, `w * ws`, per block) and multiplied in f32, the same sum with
the scales inside each block's dot product instead of outside it (f32 rounding apart).
Written independently of the kernels' `reference.py` (whose exact-division scale the tests
compare this with bit for bit).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxarena import workspaces

__all__ = ["dequant_blocks", "fp8_block_matmul_xla", "fp8_block_quant_xla"]

F32 = jnp.float32
_B = workspaces.FP8_BLOCK
_E4M3_MAX = 448.0
_FLOOR = 1e-4


def fp8_block_quant_xla(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(q float8_e4m3fn[T, K], scales float32[T, ceil(K / 128)])` of `x` (`[T, K]`, any
    float dtype): the `fp8_block_quant` kernel's f32 scales in the row layout."""
    t, k = x.shape
    nb = -(-k // _B)
    xb = jnp.pad(x.astype(F32), ((0, 0), (0, nb * _B - k))).reshape(t, nb, _B)
    amax = jnp.max(jnp.abs(xb), axis=-1)
    # A divisor XLA sees as a constant becomes a product with its reciprocal (off by an ulp
    # in about half the values); behind the barrier it is an array and XLA divides (IEEE).
    div = jax.lax.optimization_barrier(jnp.full(amax.shape, _E4M3_MAX, F32))
    scale = jnp.maximum(amax, F32(_FLOOR)) / div
    y = jnp.clip(xb * (F32(1.0) / scale)[..., None], -_E4M3_MAX, _E4M3_MAX)
    q = y.astype(jnp.float8_e4m3fn).reshape(t, nb * _B)[:, :k]
    return q, scale


def dequant_blocks(q: jax.Array, s: jax.Array, rows_per_scale: int) -> jax.Array:
    """`float32[R, K]` = `q * s` with one scale per `rows_per_scale` rows and 128 columns
    (`s`: `[ceil(R / rows_per_scale), ceil(K / 128)]`)."""
    r, k = q.shape
    full = jnp.repeat(jnp.repeat(s.astype(F32), rows_per_scale, 0), _B, 1)[:r, :k]
    return q.astype(F32) * full


def fp8_block_matmul_xla(xq: jax.Array, xs: jax.Array, w: dict[str, jax.Array]) -> jax.Array:
    """`fp8_block_matmul`'s product (`float32[T, N]`) of quantized activations (`xq`
    `float8_e4m3fn[T, K]`, `xs` `float32[T, ceil(K/128)]`) and a block-FP8 weight
    (`{"w": float8_e4m3fn[N, K], "scale_inv": float32[ceil(N/128), ceil(K/128)]}`)."""
    x = dequant_blocks(xq, xs, 1)
    wd = dequant_blocks(w["w"], w["scale_inv"], _B)
    return jnp.einsum("tk,nk->tn", x, wd, precision=jax.lax.Precision.HIGHEST)
