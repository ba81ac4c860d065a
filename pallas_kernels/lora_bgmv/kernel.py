"""Kernel body of the batched LoRA matmul (punica's BGMV / SGMV in one form): every token
multiplies its own adapter's weight, `out[t] = scale[s_t] * x[t] @ w[s_t]^T` with `s_t` the
token's slot, and zero for a token whose slot is outside `[0, L)` (-1: the base model).

One program per (token tile, column tile). The program visits the `L` slots in turn and, for
a slot that at least one of its tokens uses, runs the depth loop over `w[slot]` and keeps the
rows of those tokens; a slot none of its tokens uses costs a reduction over the tile's slot
ids and nothing else. A prefill packs each sequence's tokens together (one slot per segment),
so a tile runs one slot, two at a segment boundary; a decode tile of `block_m` sequences runs
as many slots as it holds distinct adapters. The shrink (`x @ A^T`, `w = A [L, r, in]`,
scale 1) and the expand (`xa @ B^T * scale`, `w = B [L, out, r]`) are this one body.

Every operand is read whole (`memory_space=pl.ANY`) with masked loads: rows past T, columns
past N and depth past K load as zeros and are never stored, so nothing is padded.

The arena forms (`cfg.x_at`, `cfg.out_at`): the shrink's `[T, r]` bf16 output is stored into
an arena region (the seed's `lora_xa`) and the expand reads it back from there. The arena
operand is `uint16[rows, 128]` (the `uint8[rows, 256]` arena reinterpreted, an XLA bitcast on
a GPU), holding the bf16 values' bits; element `(t, c)` of the region's matrix is element
`t * ld + c` counted from the region's first row (`RegionAt`), so no temporary of the
shrink's output exists.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["HALVES", "BgmvConfig", "RegionAt", "lora_bgmv_kernel"]

HALVES = 128  # bf16 elements per 256-byte arena row


@dataclasses.dataclass(frozen=True)
class RegionAt:
    """Where a row-major `bf16[T, ld]` matrix lives in an arena operand `uint16[rows, 128]`
    (the values' bits): element `(t, c)` is element `e = t * ld + c` of the region, at operand
    position `(row0 + e // 128, e % 128)`. `row0` is static (the region starts on an arena
    row), `e` is int32 (the wrapper keeps `T * ld` below 2^31). `last_row`: the operand's last row (row
    indices are clamped to it). `dump`: interpret mode only, the element (counted like `e`)
    from which a tile's masked lanes store, each to a position of its own past the region's
    rows: the interpreter's masked store writes an old value back at a masked lane's index, so
    such an index must not be a real element's."""

    row0: int
    ld: int
    last_row: int
    dump: int | None = None

    def at(self, e):
        """The operand's (row, column) of region element `e` (int32 array)."""
        return jnp.minimum(self.row0 + e // HALVES, self.last_row), e % HALVES


@dataclasses.dataclass(frozen=True)
class BgmvConfig:
    """Static shapes of one call: `t` tokens, depth `k`, `n` output columns, `slots` (L)
    adapter slots; `block_m/n/k` the tile (powers of two >= 16); `upcast`: multiply in
    float32 (interpret mode on a CPU); `add_at`: None, or the first column of the output
    (aliased to a base projection's output `y`) that column 0 of the product is added to:
    `y[t, add_at + c] = bf16(bf16(y[t, add_at + c]) + bf16(out[t, c]))` for the tokens with
    a slot, the other tokens' rows untouched. `x_at`: None, or where x (`bf16[t, k]`) lives
    in the arena operand that is the `x` ref; `out_at`: None, or where the output (`bf16[t,
    n]`) goes in the arena operand that is the output (aliased to the arena input; only the
    `[t, n]` elements are stored)."""

    t: int
    k: int
    n: int
    slots: int
    block_m: int
    block_n: int
    block_k: int
    upcast: bool = False
    add_at: int | None = None
    x_at: RegionAt | None = None
    out_at: RegionAt | None = None


def lora_bgmv_kernel(slot_ref, x_ref, w_ref, scale_ref, *refs, cfg: BgmvConfig):
    """`out[rows, cols]` of one tile (see the module docstring); with `cfg.add_at` the refs
    are `(y, out)`, `out` aliased to `y`; with `cfg.out_at` they are `(arena, out)`, `out`
    aliased to the arena operand."""
    out_ref = refs[-1]
    i, j = pl.program_id(0), pl.program_id(1)
    bm, bn, bk = cfg.block_m, cfg.block_n, cfg.block_k
    rows = i * bm + lax.broadcasted_iota(jnp.int32, (bm,), 0)
    row_ok = rows < cfg.t
    rows_c = jnp.minimum(rows, cfg.t - 1)
    slot = plgpu.load(slot_ref.at[rows_c], mask=row_ok, other=-1)
    cols = j * bn + lax.broadcasted_iota(jnp.int32, (bn,), 0)
    col_ok = cols < cfg.n
    cols_c = jnp.minimum(cols, cfg.n - 1)
    num_k = pl.cdiv(cfg.k, bk)

    def depth(slot_l, kk, acc):
        ks = kk * bk + lax.broadcasted_iota(jnp.int32, (bk,), 0)
        k_ok = ks < cfg.k
        ks_c = jnp.minimum(ks, cfg.k - 1)
        at_x = ((rows_c[:, None], ks_c[None, :]) if cfg.x_at is None else
                cfg.x_at.at(rows_c[:, None] * cfg.x_at.ld + ks_c[None, :]))  # fmt: skip
        a = plgpu.load(x_ref.at[at_x], mask=row_ok[:, None] & k_ok[None, :], other=0)
        if cfg.x_at is not None:  # the bf16 bits of `xa` in the arena
            a = lax.bitcast_convert_type(a, jnp.bfloat16)
        b = plgpu.load(w_ref.at[slot_l, cols_c[:, None], ks_c[None, :]],
                       mask=col_ok[:, None] & k_ok[None, :], other=0)  # fmt: skip
        if cfg.upcast:
            a, b = a.astype(jnp.float32), b.astype(jnp.float32)
        elif a.dtype != b.dtype:  # e.g. float32 rows holding bf16 values: no convert launch
            a = a.astype(b.dtype)
        return acc + lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)  # fmt: skip

    def per_slot(slot_l, out):
        mine = slot == slot_l
        # A while loop with a traced trip count (0 when no token of the tile uses this slot):
        # Triton refuses an scf.for with traced bounds.
        # (`jnp.max` of an int: Triton has no `reduce_or`.)
        used = jnp.max(mine.astype(jnp.int32)) > 0
        trips = jnp.where(used, jnp.int32(num_k), jnp.int32(0))
        _, acc = lax.while_loop(
            lambda c: c[0] < trips,
            lambda c: (c[0] + 1, depth(slot_l, c[0], c[1])),
            (jnp.int32(0), jnp.zeros((bm, bn), jnp.float32)),
        )
        s = plgpu.load(scale_ref.at[jnp.asarray(slot_l, jnp.int32)])
        return jnp.where(mine[:, None], acc * s, out)

    out = lax.fori_loop(0, cfg.slots, per_slot, jnp.zeros((bm, bn), jnp.float32))
    # Stores clamp to the output's bounds: masked lanes never touch memory on a GPU; in
    # interpret mode `ops.py` pads the output to whole tiles so no two lanes share an index.
    out_r = jnp.minimum(rows, out_ref.shape[0] - 1)
    mask = row_ok[:, None] & col_ok[None, :]
    if cfg.out_at is not None:  # into the arena region: only the [t, n] elements
        e = rows_c[:, None] * cfg.out_at.ld + cols_c[None, :]
        if cfg.out_at.dump is not None:
            lane = (lax.broadcasted_iota(jnp.int32, (bm, bn), 0) * bn
                    + lax.broadcasted_iota(jnp.int32, (bm, bn), 1))  # fmt: skip
            e = jnp.where(mask, e, cfg.out_at.dump + lane)
        bits = lax.bitcast_convert_type(out.astype(jnp.bfloat16), out_ref.dtype)
        plgpu.store(out_ref.at[cfg.out_at.at(e)], bits, mask=mask)
        return
    if cfg.add_at is None:
        out_c = jnp.minimum(cols, out_ref.shape[1] - 1)
    else:  # in place: only the rows of tokens with an adapter are read and written
        out_c = jnp.minimum(cfg.add_at + cols, out_ref.shape[1] - 1)
        mask = mask & (slot >= 0)[:, None]
        y = plgpu.load(out_ref.at[out_r[:, None], out_c[None, :]], mask=mask, other=0)
        delta = out.astype(jnp.bfloat16).astype(jnp.float32)
        # `y` as its bf16 region holds it (a no-op for bf16 values; a float32 `y` keeps its
        # unrounded values in the rows without an adapter, which are not stored).
        y = y.astype(jnp.bfloat16).astype(jnp.float32)
        out = (y + delta).astype(jnp.bfloat16)
    plgpu.store(out_ref.at[out_r[:, None], out_c[None, :]], out.astype(out_ref.dtype),
                mask=mask)  # fmt: skip
