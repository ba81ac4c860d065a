"""The grouped GEMMs of the MoE experts in plain XLA: the `kernels="xla"` path of
`pallas_kernels.grouped_gemm.grouped_gemm` and `grouped_gemm_fp8_into`.

Semantics (the kernels'): the rows are sorted by group, group `g` owns the next
`group_sizes[g]` rows and multiplies them by `rhs[group_offset + g]`; products accumulate in
f32; rows past the sum are zeros. FP8: the rows (`x[row_ids]`) are quantized 1 x 128
(`core.xla_fp8`) and multiplied block-scaled by `{"w": e4m3[E, N, K], "scale_inv"}`.

How: the rows are cut into tiles of `block_m` rows of one group (the kernels' work list:
at most `ceil(M / block_m) + G` tiles), and a `lax.fori_loop` over the tiles that exist (its
bound is data: an empty expert costs nothing) multiplies each tile by its group's weight,
read with a dynamic index (no `[rows, K, N]` gather, no product with every expert, which is
what `jax.lax.ragged_dot` lowers to on CPU: 65x slower at 64 experts, measured).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxarena.models.core.xla_fp8 import dequant_blocks, fp8_block_quant_xla

__all__ = ["grouped_gemm_fp8_xla", "grouped_gemm_xla"]

F32 = jnp.float32
_HI = jax.lax.Precision.HIGHEST


def _block_m(m: int, g: int) -> int:
    """Rows per tile: the power of two nearest the mean rows per group, in [8, 128]."""
    mean = max(1, m // max(g, 1))
    return int(min(128, max(8, 1 << (mean.bit_length() - 1))))


def _tiled(lhs: jax.Array, group_sizes: jax.Array, n: int,
           weight: Callable[[jax.Array], jax.Array]) -> jax.Array:  # fmt: skip
    """`float32[M, N]`: tile by tile `lhs[rows] @ weight(g)` (`weight(g)`: f32 `[K, N]`)."""
    m, k = lhs.shape
    g = group_sizes.shape[0]
    bm = _block_m(m, g)
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.cumsum(sizes), m)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends[:-1]])
    own = ends - starts
    ntiles = (own + bm - 1) // bm
    tend = jnp.cumsum(ntiles)
    lhs = jnp.pad(lhs.astype(F32), ((0, bm), (0, 0)))
    out = jnp.zeros((m + bm, n), F32)

    def body(j, out):
        grp = jnp.minimum(jnp.searchsorted(tend, j, side="right"), g - 1).astype(jnp.int32)
        kk = j - (tend[grp] - ntiles[grp])
        r0 = starts[grp] + kk * bm
        count = jnp.clip(own[grp] - kk * bm, 0, bm)
        x = jax.lax.dynamic_slice(lhs, (r0, 0), (bm, k))
        y = jnp.dot(x, weight(grp), precision=_HI)
        cur = jax.lax.dynamic_slice(out, (r0, 0), (bm, n))
        keep = (jnp.arange(bm) < count)[:, None]
        return jax.lax.dynamic_update_slice(out, jnp.where(keep, y, cur), (r0, 0))

    return jax.lax.fori_loop(0, tend[-1], body, out)[:m]


def _offset(group_offset: Any, g: int, w: int) -> jax.Array:
    """The first weight's index, clipped into `[0, W - G]` as the kernels clip it."""
    if group_offset is None:
        return jnp.zeros((), jnp.int32)
    return jnp.clip(jnp.asarray(group_offset, jnp.int32), 0, w - g)


def grouped_gemm_xla(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                     out_dtype: Any = None, group_offset: Any = None) -> jax.Array:  # fmt: skip
    """`grouped_gemm`'s result: `lhs [M, K]` (rows sorted by group), `rhs [W, K, N]`,
    `group_sizes int[G]`; `[M, N]` of `out_dtype` (default lhs's)."""
    off = _offset(group_offset, group_sizes.shape[0], rhs.shape[0])
    out = _tiled(lhs, group_sizes, rhs.shape[2],
                 lambda e: jax.lax.dynamic_index_in_dim(rhs, off + e, 0, False).astype(F32))
    return out.astype(lhs.dtype if out_dtype is None else out_dtype)


def grouped_gemm_fp8_xla(x: jax.Array, w: jax.Array, scale_inv: jax.Array,
                         group_sizes: jax.Array, *, row_ids: jax.Array | None = None,
                         out_dtype: Any = jnp.bfloat16,
                         group_offset: Any = None) -> jax.Array:  # fmt: skip
    """`grouped_gemm_fp8_into`'s output: `x [T, K]` quantized 1 x 128, the sorted rows
    `x[row_ids]` (all of `x` without `row_ids`) times `w [W, N, K]` e4m3 with `scale_inv [W,
    ceil(N/128), ceil(K/128)]` per group; `[M, N]` of `out_dtype`."""
    q, s = fp8_block_quant_xla(x)
    xd = dequant_blocks(q, s, 1)  # a row's quantization does not depend on the others
    if row_ids is not None:
        xd = xd[row_ids]
    off = _offset(group_offset, group_sizes.shape[0], w.shape[0])

    def weight(e):
        i = off + e
        wq = jax.lax.dynamic_index_in_dim(w, i, 0, False)
        ws = jax.lax.dynamic_index_in_dim(scale_inv, i, 0, False)
        return dequant_blocks(wq, ws, 128).T

    return _tiled(xd, group_sizes, w.shape[1], weight).astype(out_dtype)
