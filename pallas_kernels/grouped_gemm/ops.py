"""Public wrappers of the dropless grouped GEMM (bf16/f32 and block-FP8), and its work list.

`grouped_gemm(lhs, rhs, group_sizes)` computes, for rows sorted by group,
`out[r] = lhs[r] @ rhs[g(r)]` with `g(r)` the group whose row range holds `r`; rows past
`sum(group_sizes)` are zeros. It is `jax.lax.ragged_dot` without the dense fallback: XLA's
default GPU rewrite of `ragged_dot` builds an `[M, G * K]` operand (4 GiB at Qwen3-30B-A3B's
expert shapes, M=8192, K=2048, G=128), this kernel no temporary beyond its work list.

The work list (megablox's `make_group_metadata`, tokamax's ragged-dot grid): the rows are cut
into `block_m` tiles; a group spanning tiles `t0..t1` owns one item per tile, so a tile that
straddles a group boundary is visited once per group with a row mask. With the rows past the
sum as one more "zero group", at most `tiles_m + G` items cover `[0, M)`; the grid is
`(tiles_m + G, ceil(N / block_n))` and the programs past the item count return at once.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._args import is_int, resolve_interpret
from pallas_kernels._cost import declare_fixed, nbytes, touched_groups
from pallas_kernels.fp8_block_quant import fp8_block_quant
from pallas_kernels.grouped_gemm.checks import (
    check_dense,
    check_fp8,
    check_group_offset,
    check_group_sizes,
    check_row_ids,
)
from pallas_kernels.grouped_gemm.kernel import GemmConfig, grouped_gemm_kernel

__all__ = [
    "FP8_BLOCK",
    "grouped_gemm",
    "grouped_gemm_fp8",
    "max_work_items",
    "work_list",
]

FP8_BLOCK = 128
"""The block of the FP8 format: 1 x 128 activation scales, 128 x 128 weight scales."""

BLOCK_N = 64  # the seed sizes the work list in 64-column tiles (spec §10)
_MAX_BLOCK_M = 128  # and in 128-row tiles


def default_block_m(m: int) -> int:
    """Rows per tile: 128, or the next power of two of M (at least 16) for fewer rows."""
    return max(16, min(_MAX_BLOCK_M, pl.next_power_of_2(max(m, 1))))


def max_work_items(m: int, groups: int, block_m: int) -> int:
    """Length of the work list: `ceil(M / block_m) + G` (tiles, one extra visit per group
    boundary, and the zero group of rows past `sum(group_sizes)`)."""
    return pl.cdiv(m, block_m) + groups


def work_list(group_sizes: jax.Array, m: int, block_m: int) -> tuple[jax.Array, ...]:
    """The tile work list of `M` rows sorted into `len(group_sizes)` groups.

    Args:
      group_sizes: `int[G]` rows per group (traced is fine). Negative entries count as 0 and
        the cumulative sum is clipped to M.
      m: rows of the sorted problem (static).
      block_m: rows per tile (static).

    Returns:
      `(items int32[I, 2], bounds int32[G + 2], count int32[1])`: `items[i] = (group, m_tile)`
      for `i < count`, `(G + 1, 0)` after; group `g` owns rows `bounds[g]:bounds[g + 1]`;
      group `G` is the rows past the sum (written as zeros). `I = max_work_items(M, G, block_m)`
      (8 bytes per item, as the seed's `moe_fp8_scratch` sizes it). Compare-and-sum instead of
      `searchsorted`: no while loop on a GPU.
    """
    g = group_sizes.shape[0]
    sizes = jnp.maximum(group_sizes.astype(jnp.int32), 0)
    ends = jnp.minimum(jnp.cumsum(sizes), m)
    starts = jnp.concatenate([jnp.zeros((1,), jnp.int32), ends])  # G + 1 starts
    ends = jnp.concatenate([ends, jnp.full((1,), m, jnp.int32)])  # the zero group ends at M
    first = starts // block_m
    last = (ends + block_m - 1) // block_m
    tiles = jnp.where(ends > starts, last - first, 0)
    cum = jnp.cumsum(tiles)
    count = cum[-1:]
    idx = jnp.arange(max_work_items(m, g, block_m), dtype=jnp.int32)
    grp = jnp.sum(cum[None, :] <= idx[:, None], axis=1, dtype=jnp.int32)  # G + 1 when unused
    gc = jnp.minimum(grp, g)
    tile = jnp.where(grp <= g, first[gc] + idx - (cum - tiles)[gc], 0)
    items = jnp.stack([grp, tile], axis=1)
    bounds = jnp.concatenate([starts, jnp.full((1,), m, jnp.int32)])
    return items, bounds, count


@functools.partial(jax.jit, static_argnames=("cfg", "out_dtype", "interpret"))
def run_gemm(items, bounds, count, row_ids, lhs, lhs_scale, rhs, rhs_scale, group_offset=None,
             *, cfg: GemmConfig, out_dtype: Any, interpret: bool) -> jax.Array:  # fmt: skip
    """The `pallas_call` over a given work list; returns `out[cfg.m, cfg.n]`. `group_offset`
    (`int32[1]`) goes in when `cfg.rhs_groups` is set."""
    operands = [items, bounds, count]
    operands += [row_ids] if cfg.gather else []
    operands += [lhs] + ([lhs_scale] if cfg.fp8 else []) + [rhs] + ([rhs_scale] if cfg.fp8 else [])
    operands += [group_offset] if cfg.rhs_groups else []
    num_items = items.shape[0]
    n_tiles = pl.cdiv(cfg.n, cfg.block_n)
    # Interpret mode: whole tiles of output (see the kernel's store); compiled: exactly [m, n].
    rows = pl.cdiv(cfg.m, cfg.block_m) * cfg.block_m if interpret else cfg.m
    cols = n_tiles * cfg.block_n if interpret else cfg.n
    # The weights of the groups (experts) the rows touch under uniform routing, the rows of
    # lhs once per N tile, the output once; 2 * M * N * K flops.
    rhs_like = [a for a in operands if a.ndim == 3]
    share = touched_groups(rhs_like[0].shape[0], cfg.m) / rhs_like[0].shape[0] if rhs_like else 1
    declare_fixed("grouped_gemm_fp8" if cfg.fp8 else "grouped_gemm", (num_items, n_tiles), operands,
                  bytes=share * nbytes(*rhs_like) + n_tiles * cfg.m * cfg.k * jnp.dtype(lhs.dtype).itemsize
                  + cfg.m * cfg.n * jnp.dtype(out_dtype).itemsize,
                  flops=2 * cfg.m * cfg.n * cfg.k)  # fmt: skip
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(
        functools.partial(grouped_gemm_kernel, cfg=cfg),
        grid=(num_items, n_tiles),
        in_specs=[any_spec] * len(operands),
        out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct((rows, cols), out_dtype),
        interpret=interpret,
        # Triton explicitly: jax 0.10 otherwise lowers GPU pallas_calls with Mosaic GPU.
        compiler_params=plgpu.CompilerParams(num_warps=8, num_stages=1),
        name="grouped_gemm_fp8" if cfg.fp8 else "grouped_gemm",
    )(*operands)
    return out[: cfg.m, : cfg.n] if interpret else out


def _block(name: str, value: Any, default: int) -> int:
    if value is None:
        return default
    if not is_int(value) or value < 16 or value & (value - 1):
        raise ValueError(f"{name}={value!r} must be a power of two >= 16 (a Triton tile)")
    return int(value)


def grouped_gemm(
    lhs: jax.Array,
    rhs: jax.Array,
    group_sizes: jax.Array,
    *,
    out_dtype: Any = None,
    block_m: int | None = None,
    interpret: bool | None = None,
    group_offset: Any = None,
) -> jax.Array:
    """Dropless grouped GEMM: `out[r] = lhs[r] @ rhs[g]` for the rows `r` of group `g`.

    The rows of `lhs` are sorted by group: group 0 owns rows `0:group_sizes[0]`, group 1 the
    next `group_sizes[1]`, and so on. Products accumulate in f32 (bf16 inputs are multiplied
    exactly). Rows past `sum(group_sizes)` are zeros (`jax.lax.ragged_dot` leaves them
    unspecified). One launch; no temporary but the work list (`(ceil(M/block_m) + G) * 8`
    bytes).

    Args:
      lhs: `[M, K]` bfloat16, float16 or float32, rows sorted by group. Not donated.
      rhs: `[G, K, N]` bfloat16, float16 or float32, one weight per group; with
        `group_offset`, `[W, K, N]` with `W >= G` weights (e.g. `L` layers' experts, `[L, E, K,
        N]` reshaped, a free bitcast).
      group_sizes: `int[G]` rows per group; may be traced (one compiled function serves every
        routing). Its sum must not exceed M (checked when concrete; traced: the cumulative sum
        is clipped to M and negative entries count as 0).
      out_dtype: the output dtype; default `lhs.dtype`.
      block_m: rows per tile, a power of two >= 16; default 128 (fewer for small M).
      interpret: None: the Pallas interpreter on CPU, the compiled Triton kernel on GPU.
      group_offset: None, or an integer scalar (may be traced): group `g` multiplies by
        `rhs[group_offset + g]`, read in place (a layer's experts of a layer-stacked weight
        under `lax.scan`, with no copy of the layer's slice). A traced offset is clipped into
        `[0, W - G]`.

    Returns:
      `[M, N]` of `out_dtype`.

    Raises:
      ValueError: wrong ranks, dtypes or shapes; a `group_sizes` of another length than G (or,
        with `group_offset`, longer than W), not integer, negative or summing past M
        (concrete); a bad `block_m`; a `group_offset` not one integer, or concrete and outside
        `[0, W - G]`.
    """
    m, k, n, w = check_dense(lhs, rhs)
    offset = check_group_offset(group_offset, group_sizes, w)
    g = w if offset is None else group_sizes.shape[0]
    check_group_sizes(group_sizes, g, m)
    bm = _block("block_m", block_m, default_block_m(m))
    out_dtype = jnp.dtype(lhs.dtype if out_dtype is None else out_dtype)
    interpret = resolve_interpret(interpret)
    if m == 0 or n == 0:
        return jnp.zeros((m, n), out_dtype)
    if k == 0:
        return jnp.zeros((m, n), out_dtype)
    cfg = GemmConfig(m=m, k=k, n=n, groups=g, block_m=bm, block_n=BLOCK_N,
                     block_k=min(64, max(16, pl.next_power_of_2(k))),
                     rhs_groups=0 if offset is None else w)  # fmt: skip
    items, bounds, count = work_list(group_sizes, m, bm)
    return run_gemm(items, bounds, count, None, lhs, None, rhs, None, offset, cfg=cfg,
                    out_dtype=out_dtype, interpret=interpret)  # fmt: skip


def _bits(a: jax.Array) -> jax.Array:
    """e4m3 values as their uint8 bits (a bitcast; the kernel casts them back)."""
    return jax.lax.bitcast_convert_type(a, jnp.uint8)


def fp8_config(m: int, k: int, n: int, g: int, bm: int, *, gather: bool, interpret: bool,
               rhs_groups: int = 0):  # fmt: skip
    """The `GemmConfig` of a block-FP8 grouped GEMM (`rhs_groups`: `GemmConfig`'s)."""
    # 32-deep steps (four per scale block): 128-deep spills on an H200, 64-deep on a B200.
    return GemmConfig(m=m, k=k, n=n, groups=g, block_m=bm, block_n=BLOCK_N, block_k=32,
                      fp8=True, rhs_nk=True, gather=gather, upcast=interpret,
                      rhs_groups=rhs_groups)  # fmt: skip


def grouped_gemm_fp8(
    x: jax.Array,
    w: jax.Array,
    scale_inv: jax.Array,
    group_sizes: jax.Array,
    *,
    row_ids: jax.Array | None = None,
    out_dtype: Any = jnp.bfloat16,
    block_m: int | None = None,
    interpret: bool | None = None,
    group_offset: Any = None,
) -> jax.Array:
    """Grouped GEMM with block-FP8 weights: the Qwen3-30B-A3B-FP8 / DeepSeek-V3 format.

    The activations are quantized 1 x 128 (`pallas_kernels.fp8_block_quant`, f32 scales), then
    `out[r] = sum_kb (q[r, kb] @ w[g, :, kb].T) * s[r, kb] * scale_inv[g, :, kb]` in f32 for
    the rows `r` of group `g`, with each 128 x 128 block of `w` dequantized by its scale; rows
    past `sum(group_sizes)` are zeros. This is vLLM's `native_w8a8_block_matmul` per expert
    (the reference of `torch_w8a8_block_fp8_moe`) with the quantizer's floor `1e-4` on the
    block max instead of vLLM's `1e-10`, which only changes all-but-zero blocks.

    Args:
      x: `[T, K]` bfloat16, float16 or float32: the sorted rows, or, with `row_ids`, the token
        rows the sorted rows read (vLLM's `A row = sorted_id // top_k`: each token quantized
        once). Not donated.
      w: `float8_e4m3fn[G, N, K]`, the checkpoint's layout (`[out, in]` per expert).
      scale_inv: `float32[G, ceil(N / 128), ceil(K / 128)]` (`weight_scale_inv`).
      group_sizes: `int[G]` sorted rows per group, as for `grouped_gemm`.
      row_ids: optional `int[M]`: sorted row `r` reads `x[row_ids[r]]`; without it M = T.
      out_dtype: output dtype, default bfloat16 (vLLM's `output_dtype=a.dtype`).
      block_m, interpret, group_offset: as for `grouped_gemm` (`w` and `scale_inv` then hold
        `W >= G` experts; group `g` reads `w[group_offset + g]` and its scales).

    Returns:
      `[M, N]` of `out_dtype`.

    Raises:
      ValueError: wrong ranks, dtypes, shapes (`scale_inv` must match `w`'s 128-blocks),
        `group_sizes` as for `grouped_gemm`, a concrete `row_ids` outside `[0, T)`.
    """
    t, k, n, wg = check_fp8(x, w, scale_inv, FP8_BLOCK)
    m = t if row_ids is None else check_row_ids(row_ids, t)
    offset = check_group_offset(group_offset, group_sizes, wg)
    g = wg if offset is None else group_sizes.shape[0]
    check_group_sizes(group_sizes, g, m)
    bm = _block("block_m", block_m, default_block_m(m))
    out_dtype = jnp.dtype(out_dtype)
    interpret = resolve_interpret(interpret)
    if m == 0 or n == 0 or k == 0 or t == 0:
        return jnp.zeros((m, n), out_dtype)
    q, scales = fp8_block_quant(x, block_size=FP8_BLOCK, interpret=interpret)
    cfg = fp8_config(m, k, n, g, bm, gather=row_ids is not None, interpret=interpret,
                     rhs_groups=0 if offset is None else wg)  # fmt: skip
    items, bounds, count = work_list(group_sizes, m, bm)
    ids = None if row_ids is None else row_ids.astype(jnp.int32)
    q, w = _bits(q), _bits(w)
    return run_gemm(items, bounds, count, ids, q, scales, w, scale_inv, offset, cfg=cfg,
                    out_dtype=out_dtype, interpret=interpret)  # fmt: skip
