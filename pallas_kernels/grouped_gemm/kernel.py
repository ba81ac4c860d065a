"""Kernel body of the dropless grouped GEMM: one program per (work item, column tile).

A work item is `(group, m_tile)`: the `block_m` rows of tile `m_tile` that belong to `group`
(megablox's `make_group_metadata`: a tile that straddles a group boundary is visited once per
group, each visit masked to that group's rows). Group `G` (one past the experts) is the "zero
group": the rows past `sum(group_sizes)`, which the kernel writes as zeros without reading a
weight. Items at or past the item count are idle programs that store nothing.

Every operand is read whole (`memory_space=pl.ANY`) with masked loads, so nothing is padded:
rows of another group, rows past M, columns past N and depth past K load as zeros and are never
stored. Grids, block sizes and the work list live in `ops.py`.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["GemmConfig", "grouped_gemm_kernel"]


@dataclasses.dataclass(frozen=True)
class ArenaAt:
    """Where the FP8 arena form's operands are in the arena operand `uint32[rows, 64]`: the
    first row of each `moe_fp8_scratch` part (activation `[R, K]` e4m3 bytes, scales
    `f32[R, nb]`, work list `int32[I, 2]`, u32 counter) and the operand's last row."""

    act_row0: int
    scale_row0: int
    items_row0: int
    count_row0: int
    last_row: int


_WORDS = 64  # 32-bit words per 256-byte arena row


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """Static shapes and choices of one grouped GEMM.

    `m` rows of the sorted problem, contracting depth `k`, `n` output columns, `groups` experts;
    `block_m/n/k` the tile; `fp8`: e4m3 operands with 1 x `scale_block` activation scales and
    `scale_block` x `scale_block` weight scales (`block_k` and `block_n` divide it); `rhs_nk`: the
    weight is `[G, N, K]` (else `[G, K, N]`); `gather`: lhs row `r` of the sorted problem is
    `lhs[row_ids[r]]`; `upcast`: multiply in f32 (interpret mode, where the CPU has no fp8 dot);
    `rhs_groups`: the weights `rhs` holds (0: `groups`); with more, a scalar `group_offset`
    operand picks the `groups` consecutive weights group 0 starts at (clipped to
    `[0, rhs_groups - groups]`): one layer's experts of a layer-stacked weight, read in place.
    """

    m: int
    k: int
    n: int
    groups: int
    block_m: int
    block_n: int
    block_k: int
    fp8: bool = False
    rhs_nk: bool = False
    gather: bool = False
    upcast: bool = False
    scale_block: int = 128
    arena: ArenaAt | None = None
    rhs_groups: int = 0


def _scalar(ref, *idx):
    return plgpu.load(ref.at[tuple(jnp.asarray(x, jnp.int32) for x in idx)])


def _as_fp8(bits):
    # FP8 operands travel as their uint8 bits: a masked load's `other=0` cannot be cast to
    # f8 by the Triton lowering, an integer zero can (and 0x00 is e4m3's +0).
    return lax.bitcast_convert_type(bits, jnp.float8_e4m3fn)


def grouped_gemm_kernel(*refs, cfg: GemmConfig) -> None:
    """One `[block_m, block_n]` output tile of one work item.

    Refs, in order: `items int32[I, 2]` (group, m_tile), `bounds int32[G + 2]` (group `g` is rows
    `bounds[g]:bounds[g + 1]`, group `G` the zero rows), `count int32[1]` (items in use), then
    `row_ids int32[m]` when `gather`, `lhs [rows, K]`, `lhs_scale f32[rows, ceil(K/bk)]` when
    `fp8`, `rhs` (`[G, K, N]` or `[G, N, K]`), `rhs_scale f32[G, ceil(N/128), ceil(K/128)]` when
    `fp8`, `group_offset int32[1]` when `cfg.rhs_groups`, and the output `[m, N]`. With
    `cfg.arena`: `bounds`, `row_ids` when `gather`, the
    arena operand `uint32[rows, 64]` (work list, counter, activations and scales, `ArenaAt`),
    `rhs`, `rhs_scale`, `group_offset` and the output.
    """
    refs = list(refs)
    at = cfg.arena
    if at is None:
        items_ref, bounds_ref, count_ref = refs[:3]
        rest = refs[3:]
    else:
        bounds_ref, rest = refs[0], refs[1:]
    row_ids_ref = rest.pop(0) if cfg.gather else None
    lhs_ref = rest.pop(0)
    lhs_scale_ref = rest.pop(0) if cfg.fp8 and at is None else None
    rhs_ref = rest.pop(0)
    rhs_scale_ref = rest.pop(0) if cfg.fp8 else None
    offset_ref = rest.pop(0) if cfg.rhs_groups else None
    (out_ref,) = rest

    def word(row0, index, mask=None):
        """The 32-bit word `index` (int32) of the arena part starting at row `row0`."""
        r = jnp.minimum(row0 + index // _WORDS, at.last_row)
        if mask is None:
            return plgpu.load(lhs_ref.at[r, index % _WORDS])
        return plgpu.load(lhs_ref.at[r, index % _WORDS], mask=mask, other=0)

    def item(i, field):
        if at is None:
            return _scalar(items_ref, i, field)
        return lax.bitcast_convert_type(word(at.items_row0, 2 * i + field), jnp.int32)

    def count():
        if at is None:
            return _scalar(count_ref, 0)
        return lax.bitcast_convert_type(word(at.count_row0, jnp.int32(0)), jnp.int32)

    def load_a(src, ks_c, mask):
        if at is None:
            return plgpu.load(lhs_ref.at[src[:, None], ks_c[None, :]], mask=mask, other=0)
        # e4m3 byte `src * K + k` of the activation part: its word, then the byte within.
        byte = src[:, None] * cfg.k + ks_c[None, :]
        w = word(at.act_row0, byte // 4, mask)
        return ((w >> (8 * (byte % 4)).astype(jnp.uint32)) & jnp.uint32(0xFF)).astype(jnp.uint8)

    def load_a_scale(src, kb, mask):
        if at is None:
            return plgpu.load(lhs_scale_ref.at[src, kb], mask=mask, other=0.0)
        w = word(at.scale_row0, src * pl.cdiv(cfg.k, cfg.scale_block) + kb, mask)
        return lax.bitcast_convert_type(w, jnp.float32)

    i, j = pl.program_id(0), pl.program_id(1)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    g = item(i, 0)
    tile = item(i, 1)
    valid = i < count()
    gc = jnp.clip(g, 0, cfg.groups)
    lo = jnp.where(valid, _scalar(bounds_ref, gc), 0)
    hi = jnp.where(valid, _scalar(bounds_ref, gc + 1), 0)

    rows = tile * bm + lax.broadcasted_iota(jnp.int32, (bm,), 0)
    row_ok = (rows >= lo) & (rows < hi)
    rows_c = jnp.clip(rows, 0, cfg.m - 1)
    if cfg.gather:
        src = plgpu.load(row_ids_ref.at[rows_c], mask=row_ok, other=0)
    else:
        src = rows_c
    cols = j * bn + lax.broadcasted_iota(jnp.int32, (bn,), 0)
    col_ok = cols < cfg.n
    cols_c = jnp.minimum(cols, cfg.n - 1)
    ge = jnp.minimum(gc, cfg.groups - 1)  # the zero group reads no weight (trip count 0)
    if offset_ref is not None:
        ge = ge + jnp.clip(_scalar(offset_ref, 0), 0, cfg.rhs_groups - cfg.groups)
    num_k = pl.cdiv(cfg.k, bk)
    # Depth steps this program runs: 0 for the zero group and idle items. A while loop (scf.while):
    # a `fori_loop` with a traced trip count lowers to an scf.for whose bounds Triton refuses.
    trips = jnp.where(valid & (gc < cfg.groups), jnp.int32(num_k), jnp.int32(0))

    def body(kk, acc):
        ks = kk * bk + lax.broadcasted_iota(jnp.int32, (bk,), 0)
        k_ok = ks < cfg.k
        ks_c = jnp.minimum(ks, cfg.k - 1)
        a = load_a(src, ks_c, row_ok[:, None] & k_ok[None, :])
        a = _as_fp8(a) if cfg.fp8 else a
        if cfg.rhs_nk:
            b = plgpu.load(
                rhs_ref.at[ge, cols_c[:, None], ks_c[None, :]],
                mask=col_ok[:, None] & k_ok[None, :],
                other=0,
            )
            b = _as_fp8(b) if cfg.fp8 else b
            if cfg.upcast:
                a, b = a.astype(jnp.float32), b.astype(jnp.float32)
            part = lax.dot_general(
                a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
            )
        else:
            b = plgpu.load(
                rhs_ref.at[ge, ks_c[:, None], cols_c[None, :]],
                mask=k_ok[:, None] & col_ok[None, :],
                other=0,
            )
            if cfg.upcast:
                a, b = a.astype(jnp.float32), b.astype(jnp.float32)
            part = jnp.dot(a, b, preferred_element_type=jnp.float32)
        if cfg.fp8:
            kb = (kk * bk) // cfg.scale_block  # block_k divides the 128-wide scale block
            a_s = load_a_scale(src, kb, row_ok)
            w_s = _scalar(rhs_scale_ref, ge, (j * bn) // cfg.scale_block, kb)
            part = part * (a_s[:, None] * w_s)
        return acc + part

    _, acc = lax.while_loop(
        lambda c: c[0] < trips,
        lambda c: (c[0] + 1, body(c[0], c[1])),
        (jnp.int32(0), jnp.zeros((bm, bn), jnp.float32)),
    )
    # Stores clamp to the output's own bounds: on a GPU masked lanes never touch memory; in
    # interpret mode `ops.py` pads the output to whole tiles, so no two lanes share an index
    # (the interpreter's masked scatter writes masked lanes back with their old value).
    out_r = jnp.minimum(rows, out_ref.shape[0] - 1)
    out_c = jnp.minimum(cols, out_ref.shape[1] - 1)
    plgpu.store(
        out_ref.at[out_r[:, None], out_c[None, :]],
        acc.astype(out_ref.dtype),
        mask=row_ok[:, None] & col_ok[None, :],
    )
