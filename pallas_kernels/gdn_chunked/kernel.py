"""Kernel bodies of the Gated DeltaNet chunked prefill (the algorithm only; see `ops.py`).

Every sequence is cut into chunks of 64 tokens from its own first token (the last chunk of a
sequence is padded), so a chunk belongs to one sequence. `cmap int32[4, NT]` describes chunk
slot `c`: its sequence, its first token, its valid rows `n` (1..64) and flags (bit 0: first
chunk of its sequence, bit 1: last chunk, bit 2: in use). Padded rows read `k = v = g = beta =
0`, which leaves every sum unchanged: `w`, `u` and `v_new` are 0 there and the cumulative gate
of a padded row equals that of the chunk's last valid row. In the arena form the slots of a
call may outnumber the region's: the kernels then run in rounds over the next `NT` slots each
(ops.py), `cmap` describing the round's, and the state kernel carries a sequence cut by a
round boundary through the final states (f32).

Three kernels, all addressing the scratch `ws uint16[rows, 128]` (256-byte rows; the whole
arena in the arena form) at the section rows of `jaxarena.workspaces.gdn_fla_sections`:

- `gdn_prep_kernel` (grid chunk x value head): `gc` = within-chunk cumsum of `g` (f32, stored
  as its two 16-bit halves in the even / odd columns of the row, i.e. the f32 bytes),
  `A = (I + L)^-1` with `L[i, j] = beta_i (k_i . k_j) exp(gc_i - gc_j)` for `i > j` (forward
  substitution, on chip only), `w = A (beta exp(gc) k)`, `u = A (beta v)` into `W`, `U`.
- `gdn_state_kernel` (grid value head x block of value columns): walks the chunk slots in
  order with the state `h [K, block_v]` f32 in registers; per chunk stores `h` into `S` and
  `v_new = u - w h` into `uc`, then `h <- exp(gc_last) h + k^T (v_new exp(gc_last - gc))`;
  `h` starts from the final-state array (holding the initial states) and is written back
  to it at a sequence's last chunk (and at a round's last slot).
- `gdn_output_kernel` (grid chunk x value head x block of value columns):
  `o = scale (q S) exp(gc) + scale tril(q k^T exp(gc_i - gc_j)) v_new`.

Matrix products run on bf16 tensor-core operands with f32 accumulation, as FLA's do, but an
operand held in f32 on chip (the state, `A`, the L2-normalised q / k, `v_new`) enters as two
bf16 parts, hi + lo (`_dot`): only the values the region stores in bf16 (W, U, S, uc) carry
bf16 rounding. This halved the RMS error against the float64 recurrence (4e-3 -> 2.5e-3 on
the test cases) for at most 3 products instead of 1. The state, gates and `A` stay f32.
H200 registers at 128x128 heads on 8 warps (tests/gpu/test_gdn_gpu.py): prep 197, state 174,
output 182, no spills.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

CHUNK = 64
# cmap flag bits
FIRST, LAST, ACTIVE = 1, 2, 4
# Contract dim 0 of both operands (`a^T @ b`) / dim 1 of both (`a @ b^T`).
_TN = (((0,), (0,)), ((), ()))
_NT = (((1,), (1,)), ((), ()))


@dataclasses.dataclass(frozen=True)
class GdnGeom:
    """Static geometry of one call (hashable: part of the jit cache key)."""

    num_tokens: int
    num_heads: int  # key heads H
    num_value_heads: int  # HV, a multiple of H
    key_dim: int
    value_dim: int
    num_seqs: int
    num_chunks: int  # chunk slots NT of the scratch the call may use
    w_row: int
    u_row: int
    s_row: int
    uc_row: int
    gc_row: int
    scale: float
    l2norm: bool
    block_v: int


def _split(x):
    """`x` as bf16 parts `[hi, lo]` with `hi + lo = x` to ~16 bits (`[x]` when x is bf16)."""
    if x.dtype == jnp.bfloat16:
        return [x]
    hi = x.astype(jnp.bfloat16)
    return [hi, (x - hi.astype(jnp.float32)).astype(jnp.bfloat16)]


def _dot(a, b, dims=None):
    """`a @ b` (or `dot_general` with `dims`) from bf16 parts accumulated in f32 (tensor cores
    on the GPU): a float32 operand is split into hi + lo bf16 parts and the products of the
    parts are summed, except lo x lo (below f32 resolution for the result's scale), so an
    operand that is not stored in bf16 loses ~16 bits, not bf16's 8."""
    out = None
    for i, pa in enumerate(_split(a)):
        for j, pb in enumerate(_split(b)):
            if i and j:
                continue
            if dims is None:
                p = jnp.dot(pa, pb, preferred_element_type=jnp.float32)
            else:
                p = jax.lax.dot_general(pa, pb, dims, preferred_element_type=jnp.float32)
            out = p if out is None else out + p
    return out


def _iota2(axis):
    return jax.lax.broadcasted_iota(jnp.int32, (CHUNK, CHUNK), axis)


def _chunk(cmap_ref, c):
    seq, start, n, flags = (cmap_ref[i, c] for i in range(4))
    return seq, start, n, flags


def _rows(ref, start, n, *rest):
    """`ref[start : start + 64, *rest]` as f32, rows at or past `n` read as 0 (never loaded)."""
    idx = (pl.ds(start, CHUNK), *rest)
    shape = (CHUNK,) + (1,) * (len(ref.at[idx].shape) - 1)
    valid = (jnp.arange(CHUNK) < n).reshape(shape)
    return plgpu.load(ref.at[idx], mask=valid, other=0).astype(jnp.float32)


def _keys(ref, start, n, head, geom: GdnGeom, *, scale: float = 1.0):
    """q or k rows of a chunk `[64, K]` f32, L2-normalised per row with `geom.l2norm`
    (FLA's `x / sqrt(sum x^2 + 1e-6)`)."""
    x = _rows(ref, start, n, head, slice(None))
    if geom.l2norm:
        x = x * jax.lax.rsqrt(jnp.sum(x * x, axis=1, keepdims=True) + 1e-6)
    return x * scale if scale != 1.0 else x


def _load_bf16(ref, row, nrows, cols):
    return jax.lax.bitcast_convert_type(ref[pl.ds(row, nrows), cols], jnp.bfloat16)


def _store_bf16(ref, row, nrows, cols, x):
    ref[pl.ds(row, nrows), cols] = jax.lax.bitcast_convert_type(x.astype(jnp.bfloat16), jnp.uint16)


def _store_gc(ref, row, gc):
    """The 64 f32 of `gc` into one row, little-endian: low half at 2i, high half at 2i + 1."""
    bits = jax.lax.bitcast_convert_type(gc, jnp.uint32)
    ref[pl.ds(row, 1), pl.ds(0, CHUNK, stride=2)] = (bits & 0xFFFF).astype(jnp.uint16)[None, :]
    ref[pl.ds(row, 1), pl.ds(1, CHUNK, stride=2)] = (bits >> 16).astype(jnp.uint16)[None, :]


def _load_gc(ref, row):
    lo = ref[pl.ds(row, 1), pl.ds(0, CHUNK, stride=2)][0].astype(jnp.uint32)
    hi = ref[pl.ds(row, 1), pl.ds(1, CHUNK, stride=2)][0].astype(jnp.uint32)
    return jax.lax.bitcast_convert_type(lo | (hi << 16), jnp.float32)


def _inverse_unit_lower(lm):
    """`(I + L)^-1` for a strictly lower triangular `[64, 64]` f32 `L`, by forward substitution:
    row `i` of the inverse is `e_i - sum_{j < i} L[i, j] A[j, :]` (rows `j < i` are final)."""
    rows, cols = _iota2(0), _iota2(1)

    def body(i, a):
        l_i = jnp.sum(jnp.where(rows == i, lm, 0.0), axis=0)  # L[i, :]
        new = jnp.where(jnp.arange(CHUNK) == i, 1.0, 0.0) - jnp.sum(l_i[:, None] * a, axis=0)
        return jnp.where(rows == i, new[None, :], a)

    return jax.lax.fori_loop(1, CHUNK, body, jnp.where(rows == cols, 1.0, 0.0))


def gdn_prep_kernel(cmap_ref, k_ref, v_ref, g_ref, beta_ref, ws_in_ref, ws_ref, *, geom):
    """One (chunk slot c, value head h): `gc`, `w`, `u` of the chunk into the scratch.

    Refs (whole arrays): cmap `int32[4, NT]`, k `[T, H, K]`, v `[T, HV, V]`, g / beta
    `[T, HV]`, ws_in (aliased to ws, unused), ws `uint16[rows, 128]` (written).
    """
    del ws_in_ref
    c, h = pl.program_id(0), pl.program_id(1)
    hv, K, V = geom.num_value_heads, geom.key_dim, geom.value_dim
    hk = h // (hv // geom.num_heads)
    _, start, n, flags = _chunk(cmap_ref, c)

    @pl.when((flags & ACTIVE) != 0)
    def _():
        g = _rows(g_ref, start, n, h)
        beta = _rows(beta_ref, start, n, h)
        rows, cols = _iota2(0), _iota2(1)
        gc = jnp.sum(jnp.where(rows >= cols, g[None, :], 0.0), axis=1)  # inclusive cumsum
        _store_gc(ws_ref, geom.gc_row + c * hv + h, gc)
        k = _keys(k_ref, start, n, hk, geom)
        below = rows > cols
        decay = jnp.exp(jnp.where(below, gc[:, None] - gc[None, :], 0.0))
        lm = jnp.where(below, beta[:, None] * _dot(k, k, _NT) * decay, 0.0)
        a = _inverse_unit_lower(lm)
        row0 = (c * hv + h) * CHUNK
        w = _dot(a, k * (beta * jnp.exp(gc))[:, None])
        _store_bf16(ws_ref, geom.w_row + row0, CHUNK, pl.ds(0, K), w)
        v = _rows(v_ref, start, n, h, slice(None))
        _store_bf16(ws_ref, geom.u_row + row0, CHUNK, pl.ds(0, V), _dot(a, v * beta[:, None]))


def gdn_state_kernel(cmap_ref, nact_ref, k_ref, fin_in_ref, ws_in_ref, ws_ref, final_ref, *,
                     geom):  # fmt: skip
    """One (value head h, block j of value columns): the chunk recurrence over one round.

    Refs (whole arrays): cmap `int32[4, NT]`, nact `int32[1]` (chunk slots in use this round),
    k `[T, H, K]`, fin_in / ws_in (aliased to final / ws, unused), ws (read: W, U, gc;
    written: S, uc), final `f32[S, HV, K, V]` (read and written: this head's columns).

    `final` holds each sequence's state between rounds: on entry the initial states, so a
    sequence with no chunk keeps its own. The state is read from it at a sequence's first
    chunk and at the round's first slot (a sequence continued from the previous round), and
    written to it at a sequence's last chunk and at the round's last slot in use (f32 both
    ways: a sequence cut by a round boundary is computed bit for bit as one that is not).
    """
    del fin_in_ref, ws_in_ref
    h, j = pl.program_id(0), pl.program_id(1)
    hv, K, bv = geom.num_value_heads, geom.key_dim, geom.block_v
    hk = h // (hv // geom.num_heads)
    cols = pl.ds(pl.multiple_of(j * bv, bv), bv)
    f32 = jnp.float32
    nact = nact_ref[0]

    def body(c, state):
        seq, start, n, flags = _chunk(cmap_ref, c)
        enter = ((flags & FIRST) != 0) | (c == 0)
        state = jax.lax.cond(enter, lambda: final_ref[seq, h, :, cols].astype(f32), lambda: state)
        row0 = (c * hv + h) * CHUNK
        _store_bf16(ws_ref, geom.s_row + (c * hv + h) * K, K, cols, state)
        w = _load_bf16(ws_ref, geom.w_row + row0, CHUNK, pl.ds(0, K))
        u = _load_bf16(ws_ref, geom.u_row + row0, CHUNK, cols).astype(f32)
        v_new = u - _dot(w, state)
        _store_bf16(ws_ref, geom.uc_row + row0, CHUNK, cols, v_new)
        gc = _load_gc(ws_ref, geom.gc_row + c * hv + h)
        g_last = jnp.sum(jnp.where(jnp.arange(CHUNK) == CHUNK - 1, gc, 0.0))
        k = _keys(k_ref, start, n, hk, geom)
        v_dec = v_new * jnp.exp(g_last - gc)[:, None]
        state = state * jnp.exp(g_last) + _dot(k, v_dec, _TN)

        @pl.when(((flags & LAST) != 0) | (c == nact - 1))
        def _():
            final_ref[seq, h, :, cols] = state

        return state

    jax.lax.fori_loop(0, nact, body, jnp.zeros((K, bv), f32))


def gdn_output_kernel(cmap_ref, q_ref, k_ref, ws_ref, *o_refs, geom):
    """One (chunk slot c, value head h, block j of value columns): the chunk's outputs.

    Refs (whole arrays): cmap, q / k `[T, H, K]`, ws (read: S, uc, gc), then `o [T, HV, V]`
    (written: the chunk's valid rows, this head's columns), preceded by its aliased input
    (unused) when the call runs in rounds and each round writes only its chunks' rows.
    """
    o_ref = o_refs[-1]
    c, h, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    hv, K, bv = geom.num_value_heads, geom.key_dim, geom.block_v
    hk = h // (hv // geom.num_heads)
    cols = pl.ds(pl.multiple_of(j * bv, bv), bv)
    _, start, n, flags = _chunk(cmap_ref, c)

    @pl.when((flags & ACTIVE) != 0)
    def _():
        q = _keys(q_ref, start, n, hk, geom, scale=geom.scale)
        k = _keys(k_ref, start, n, hk, geom)
        gc = _load_gc(ws_ref, geom.gc_row + c * hv + h)
        state = _load_bf16(ws_ref, geom.s_row + (c * hv + h) * K, K, cols)
        inter = _dot(q, state) * jnp.exp(gc)[:, None]
        causal = _iota2(0) >= _iota2(1)
        decay = jnp.exp(jnp.where(causal, gc[:, None] - gc[None, :], 0.0))
        m = jnp.where(causal, _dot(q, k, _NT) * decay, 0.0)
        v_new = _load_bf16(ws_ref, geom.uc_row + (c * hv + h) * CHUNK, CHUNK, cols)
        o = inter + _dot(m, v_new)
        valid = (jnp.arange(CHUNK) < n)[:, None]
        plgpu.store(o_ref.at[pl.ds(start, CHUNK), h, cols], o.astype(o_ref.dtype), mask=valid)
