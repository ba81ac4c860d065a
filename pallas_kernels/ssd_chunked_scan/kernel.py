"""Kernel bodies of the Mamba-2 SSD chunked scan (the algorithm only; see `ops.py`).

The token stream is cut into chunks of `L = chunk_size` tokens from token 0. Every token
carries the index of its sequence (`seq`, non-decreasing), so a chunk may hold the tail of
one sequence, whole short sequences and the head of the next one.

- `ssd_cumsum_cb_kernel` (phase 1, grid `(chunk c, head h)`): `dt'`, the within-chunk
  inclusive cumulative sum `dA_cumsum` of `dt' A`, and `CB = C B^T` of the head's group
  (stored by the group's first head), all three into the workspace.
- `ssd_scan_kernel` (phase 2, grid `(head h, block of head_dim columns)`): walks the chunks
  in order, holding in registers the state of the sequence that runs across each chunk edge
  (`[block_p, N]` f32), and per chunk writes the output rows of its columns,
  `y[t] = sum_{s <= t, seq[s] = seq[t]} CB[t, s] exp(dA_cumsum[t] - dA_cumsum[s]) dt'[s] x[s]`
  `+ exp(dA_cumsum[t] - dA_cumsum[p - 1]) C[t] . h_start(seq[t]) + D x[t]`
  (`p` the sequence's first token in the chunk; `h_start` the state entering the chunk for
  the first sequence, the initial state for a sequence starting inside it), and the final
  state of every sequence that ends in the chunk. The running state never leaves the chip:
  no per-chunk state, no intra-chunk output buffer, the launches do not depend on T.

Register budget (sm_90a): every matrix product is an f32 `tl.dot` at IEEE precision, which
Triton lowers to FMAs with each thread holding its rows and columns of BOTH operands over the
whole contraction. The kernels contract in slices of `block_k` tokens or `block_n` state
columns and keep every tile at most `[64, 64]` whatever the chunk length (rows in blocks of
`block_l <= 64`); the state is a tuple of `[block_p, block_n]` tiles (a value cannot be
sliced at a dynamic offset). tests/gpu/test_ssd_gpu.py checks ptxas' registers and spills.

The workspace is a 2-D f32 array `[rows, L]`: `dt'` of (chunk c, head h) is row
`dt_row + h * num_chunks_ws + c`, `dA_cumsum` row `dacs_row + h * num_chunks_ws + c`, and
`CB` of (chunk c, group g) is the `L` rows from `cb_row + (c * num_groups + g) * L`. The
kernels see the whole workspace (no block spec; in the arena form, the whole arena) and
address it with dynamic row slices.

Masks select (`jnp.where`) rather than multiply by 0 where one sequence's values meet another
sequence's: a NaN initial state or token of one sequence does not reach another sequence's
final state, nor (for initial states) its outputs. (Inside a chunk, the intra-chunk product
`M @ x` still multiplies another sequence's x by a 0 weight.)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

_HI = jax.lax.Precision.HIGHEST
# Contract dim 0 of both operands: `a^T @ b` without materialising the transpose.
_TN = (((0,), (0,)), ((), ()))
# Contract dim 1 of both operands: `a @ b^T`.
_NT = (((1,), (1,)), ((), ()))


def _softplus(v):
    # Same threshold as mamba_ssm: above 20, softplus(v) == v in f32.
    return jnp.where(v > 20.0, v, jnp.log1p(jnp.exp(jnp.minimum(v, 20.0))))


def _dot(a, b, dims=None):
    if dims is None:
        return jnp.dot(a, b, precision=_HI, preferred_element_type=jnp.float32)
    return jax.lax.dot_general(a, b, dims, precision=_HI, preferred_element_type=jnp.float32)


def _rows(ref, start, n, *rest, num_tokens: int, tail: bool):
    """`ref[start : start + n, *rest]`, tokens at or past `num_tokens` read as 0.

    The inputs are not padded to whole chunks (a padded copy would be a GPU temporary that
    grows with T): with `tail` (T not a multiple of L) the last chunk's loads are masked.
    """
    idx = (pl.ds(start, n), *rest)
    if not tail:
        return ref[idx]
    tok = start + jnp.arange(n)
    shape = (n,) + (1,) * (len(ref.at[idx].shape) - 1)
    return plgpu.load(ref.at[idx], mask=(tok < num_tokens).reshape(shape), other=0)


def _scalar(ref, row, col):
    """`ref[row, col]` of a 2-D f32 ref at dynamic indices, as a scalar."""
    return jnp.sum(ref[pl.ds(row, 1), pl.ds(col, 1)])


def ssd_cumsum_cb_kernel(
    dt_ref,
    a_ref,
    bias_ref,
    b_ref,
    c_ref,
    ws_in_ref,
    ws_ref,
    *,
    chunk_size: int,
    num_tokens: int,
    num_chunks_ws: int,
    heads_per_group: int,
    num_groups: int,
    dt_row: int,
    dacs_row: int,
    cb_row: int,
    dt_softplus: bool,
    block_l: int,
    block_n: int,
    dt_min: float = 0.0,
    dt_max: float = float("inf"),
):
    """Phase 1 for one (chunk, head). `dt' = clamp(softplus?(dt + bias), dt_min, dt_max)`
    (clamped always, as mamba_ssm's fused `_chunk_cumsum_fwd`). Refs (whole arrays):

    dt `[T, H]` (raw), a / bias `[H]`, b / c `[T, G, N]`, ws_in (aliased to ws, unused), ws
    `[rows, L]` (written). Tokens past T (the last chunk's tail) read as 0.
    """
    del ws_in_ref  # aliased to ws_ref; only written, through the output ref
    L = chunk_size
    c = pl.program_id(0)
    h = pl.program_id(1)
    g = h // heads_per_group
    pos = c * L + jnp.arange(L)

    rows = functools.partial(_rows, num_tokens=num_tokens, tail=num_tokens % L != 0)
    dt = rows(dt_ref, c * L, L, h).astype(jnp.float32) + bias_ref[h]
    if dt_softplus:
        dt = _softplus(dt)
    dt = jnp.minimum(jnp.maximum(dt, dt_min), dt_max)
    # Tokens past the end of the stream are padding: dt' = 0 keeps them out of every sum.
    dt = jnp.where(pos < num_tokens, dt, 0.0)
    dA_cs = jnp.cumsum(dt * a_ref[h])
    ws_ref[pl.ds(dt_row + h * num_chunks_ws + c, 1), :] = dt[None, :]
    ws_ref[pl.ds(dacs_row + h * num_chunks_ws + c, 1), :] = dA_cs[None, :]

    # CB depends on the group only: the group's first head stores it, in [block_l]^2 tiles.
    @pl.when(h % heads_per_group == 0)
    def _store_cb():
        num_n = b_ref.shape[2] // block_n
        nl = L // block_l
        cb0 = cb_row + (c * num_groups + g) * L

        def tile(r0, q0):
            def body(j, acc):
                cols = pl.ds(pl.multiple_of(j * block_n, block_n), block_n)
                cm = rows(c_ref, c * L + r0, block_l, g, cols).astype(jnp.float32)
                bm = rows(b_ref, c * L + q0, block_l, g, cols).astype(jnp.float32)
                return acc + _dot(cm, bm, _NT)

            acc = jnp.zeros((block_l, block_l), jnp.float32)
            ws_ref[pl.ds(cb0 + r0, block_l), pl.ds(q0, block_l)] = jax.lax.fori_loop(
                0, num_n, body, acc
            )

        def row_tiles(r, carry):
            r0 = pl.multiple_of(r * block_l, block_l)

            def col_tile(q, carry):
                tile(r0, pl.multiple_of(q * block_l, block_l))
                return carry

            return jax.lax.fori_loop(0, nl, col_tile, carry)

        jax.lax.fori_loop(0, nl, row_tiles, 0)


def ssd_scan_kernel(
    x_ref,
    b_ref,
    c_ref,
    seq_ref,
    cu_ref,
    ws_ref,
    d_ref,
    init_ref,
    z_ref,
    y_ref,
    final_ref,
    *,
    chunk_size: int,
    num_tokens: int,
    num_chunks: int,
    num_seqs: int,
    num_chunks_ws: int,
    heads_per_group: int,
    num_groups: int,
    dt_row: int,
    dacs_row: int,
    cb_row: int,
    has_d: bool,
    has_init: bool,
    block_l: int,
    block_k: int,
    block_n: int,
    block_p: int,
    d_per_col: bool = False,
    has_z: bool = False,
):
    """Phase 2 for one (head h, block j of `block_p` head_dim columns). Refs (whole arrays):

    x `[T, H, P]`, b / c `[T, G, N]`, seq `[Tp]` int32 (each token's sequence, `Tp` = whole
    chunks; padding tokens belong to the last sequence), cu `[S + 1]`
    int32 (sequence starts), ws `[rows, L]` f32 (read: phase 1's dt', dA_cumsum and CB), d
    `[H]` f32 (`[H, P]` with `d_per_col`), init `[S, H, P, N]` (unused without `has_init`),
    z `[Tp, H, P]` (unused without `has_z`: `y = (... + D x) * silu(z)`), y `[Tp, H, P]`
    (written: this head's columns), final `[S, H, P, N]` in the final states' dtype (written:
    this head's columns, rounded once from f32).

    Per chunk `c` (tokens `t0 = c * L ...`), with `s0` / `s_last` the sequences of its first
    and last token: `h_in = (cu[s0] < t0) ? h_run : init[s0]` is the state of `s0` before the
    chunk; the outputs of the chunk's rows are written (module docstring); then for every
    sequence `s` in `s0 .. s_last`, its state at its last token `e` in the chunk,
    `exp(dA[e] - dA[p - 1]) * (s == s0 ? h_in : init[s]) + sum_{t in s, t <= e}
    exp(dA[e] - dA[t]) dt'[t] x[t]^T B[t]`, is stored as its final state if `s` ends in the
    chunk, and is carried to the next chunk if `s == s_last`.
    """
    L, bl, bk, bn, bp = chunk_size, block_l, block_k, block_n, block_p
    h = pl.program_id(0)
    g = h // heads_per_group
    pcols = pl.ds(pl.multiple_of(pl.program_id(1) * bp, bp), bp)
    nn = c_ref.shape[2] // bn
    ncols = [pl.ds(n * bn, bn) for n in range(nn)]
    f32 = jnp.float32
    zero_state = tuple(jnp.zeros((bp, bn), f32) for _ in range(nn))
    tail = num_tokens % L != 0
    load = functools.partial(_rows, num_tokens=num_tokens, tail=tail)

    def init_of(s):
        if not has_init:
            return zero_state
        return tuple(init_ref[s, h, pcols, cols].astype(f32) for cols in ncols)

    # Empty sequences never appear in the stream: their final state is their initial state.
    def empty_body(s, carry):
        @pl.when(cu_ref[s] == cu_ref[s + 1])
        def _store():
            for n, v in enumerate(init_of(s)):
                final_ref[s, h, pcols, ncols[n]] = v.astype(final_ref.dtype)

        return carry

    jax.lax.fori_loop(0, num_seqs, empty_body, 0)
    d_h = d_ref[h, pcols][None, :] if d_per_col else d_ref[h]

    def chunk_body(c, h_run):
        t0 = c * L
        dt_r = dt_row + h * num_chunks_ws + c
        da_r = dacs_row + h * num_chunks_ws + c
        cb_r = cb_row + (c * num_groups + g) * L
        s0 = seq_ref[t0]
        s_last = seq_ref[t0 + L - 1]
        cont = cu_ref[s0] < t0
        h_in = init_of(s0)
        h_in = tuple(jnp.where(cont, a, b) for a, b in zip(h_run, h_in, strict=True))

        def c_dot_state(rows, state):
            """`C[rows] . state^T` for a state given as column tiles: `[block_l, block_p]`."""
            out = jnp.zeros((bl, bp), f32)
            for n, tile in enumerate(state):
                cm = load(c_ref, rows, bl, g, ncols[n]).astype(f32)
                out = out + _dot(cm, tile, _NT)
            return out

        # -- Outputs, in blocks of `block_l` rows.
        def row_block(r, carry):
            r0 = pl.multiple_of(r * bl, bl)
            rows = t0 + r0
            seq_rows = seq_ref[pl.ds(rows, bl)][:, None]  # [bl, 1]
            da_rows = jnp.transpose(ws_ref[pl.ds(da_r, 1), pl.ds(r0, bl)])  # [bl, 1]
            row_idx = r0 + jax.lax.broadcasted_iota(jnp.int32, (bl, bk), 0)

            def diag_body(k, acc):
                k0 = pl.multiple_of(k * bk, bk)
                ks = pl.ds(k0, bk)
                cb = ws_ref[pl.ds(cb_r + r0, bl), ks]  # [bl, bk]
                da_k = ws_ref[pl.ds(da_r, 1), ks]  # [1, bk]
                dt_k = ws_ref[pl.ds(dt_r, 1), ks]  # [1, bk]
                seq_k = seq_ref[pl.ds(t0 + k0, bk)][None, :]  # [1, bk]
                col_idx = k0 + jax.lax.broadcasted_iota(jnp.int32, (bl, bk), 1)
                causal = (row_idx >= col_idx) & (seq_rows == seq_k)
                seg = jnp.where(causal, da_rows - da_k, 0.0)
                m = jnp.where(causal, cb * jnp.exp(seg), 0.0) * dt_k
                return acc + _dot(m, load(x_ref, t0 + k0, bk, h, pcols).astype(f32))

            # Causal: source tokens past this row block contribute nothing.
            acc = jax.lax.fori_loop(0, (r0 + bl) // bk, diag_body, jnp.zeros((bl, bp), f32))
            # The sequence running at the chunk's start sees h_in.
            first = seq_rows == s0
            scale = jnp.exp(jnp.where(first, da_rows, 0.0))
            acc = acc + jnp.where(first, scale * c_dot_state(rows, h_in), 0.0)
            if has_init:
                # A sequence starting inside the chunk sees its initial state.
                def inner(s, acc):
                    base = _scalar(ws_ref, da_r, cu_ref[s] - t0 - 1)
                    mine = seq_rows == s
                    w = jnp.exp(jnp.where(mine, da_rows - base, 0.0))
                    return acc + jnp.where(mine, w * c_dot_state(rows, init_of(s)), 0.0)

                acc = jax.lax.fori_loop(s0 + 1, s_last + 1, inner, acc)
            if has_d:
                acc = acc + d_h * load(x_ref, rows, bl, h, pcols).astype(f32)
            if has_z:
                zv = load(z_ref, rows, bl, h, pcols).astype(f32)
                acc = acc * (zv / (1.0 + jnp.exp(-zv)))  # silu(z)
            out = acc.astype(y_ref.dtype)
            if tail:  # the rows past T are not in y
                tok = rows + jax.lax.broadcasted_iota(jnp.int32, (bl, 1), 0)
                plgpu.store(y_ref.at[pl.ds(rows, bl), h, pcols], out, mask=tok < num_tokens)
            else:
                y_ref[pl.ds(rows, bl), h, pcols] = out
            return carry

        jax.lax.fori_loop(0, L // bl, row_block, 0)

        # -- The state of every sequence of the chunk at its last token in the chunk.
        def seq_state(s, h_next):
            start_tok = cu_ref[s]
            p = jnp.maximum(start_tok - t0, 0)
            end_tok = cu_ref[s + 1]
            e = jnp.minimum(end_tok, t0 + L) - 1 - t0
            a_end = _scalar(ws_ref, da_r, jnp.maximum(e, 0))
            base = jnp.where(p > 0, _scalar(ws_ref, da_r, jnp.maximum(p - 1, 0)), 0.0)
            start = init_of(s)
            start = tuple(jnp.where(s == s0, a, b) for a, b in zip(h_in, start, strict=True))

            def own_body(k, acc):
                k0 = pl.multiple_of(k * bk, bk)
                ks = pl.ds(k0, bk)
                da_k = jnp.transpose(ws_ref[pl.ds(da_r, 1), ks])  # [bk, 1]
                dt_k = jnp.transpose(ws_ref[pl.ds(dt_r, 1), ks])
                tok = k0 + jax.lax.broadcasted_iota(jnp.int32, (bk, 1), 0)
                mine = (seq_ref[pl.ds(t0 + k0, bk)][:, None] == s) & (tok <= e)  # [bk, 1]
                w = jnp.where(mine, jnp.exp(jnp.where(mine, a_end - da_k, 0.0)) * dt_k, 0.0)
                xm = jnp.where(mine, load(x_ref, t0 + k0, bk, h, pcols).astype(f32), 0.0)
                out = []
                for n in range(nn):
                    bm = load(b_ref, t0 + k0, bk, g, ncols[n]).astype(f32)
                    bw = jnp.where(mine, bm * w, 0.0)
                    out.append(acc[n] + _dot(xm, bw, _TN))
                return tuple(out)

            own = jax.lax.fori_loop(0, L // bk, own_body, zero_state)
            decay = jnp.exp(a_end - base)
            state = tuple(decay * a + b for a, b in zip(start, own, strict=True))

            @pl.when((end_tok > start_tok) & (end_tok <= t0 + L))
            def _store():
                for n, v in enumerate(state):
                    final_ref[s, h, pcols, ncols[n]] = v.astype(final_ref.dtype)

            return tuple(jnp.where(s == s_last, a, b) for a, b in zip(state, h_next, strict=True))

        return jax.lax.fori_loop(s0, s_last + 1, seq_state, h_in)

    jax.lax.fori_loop(0, num_chunks, chunk_body, zero_state)
