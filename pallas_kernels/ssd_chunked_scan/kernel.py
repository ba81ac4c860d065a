"""Kernel bodies of the Mamba-2 SSD chunked scan (the algorithm only; see `ops.py`).

The token stream is cut into chunks of `L = chunk_size` tokens from token 0. Every token
carries the index of its sequence (`seq`, non-decreasing), so a chunk may hold the tail of
one sequence, whole short sequences and the head of the next one.

- `ssd_cumsum_cb_kernel` (phase 1, grid `(chunk c, head h)`): `dt'`, the within-chunk
  inclusive cumulative sum `dA_cumsum` of `dt' A` restarting at every sequence's first token,
  and `CB = C B^T` of the head's group (stored by the group's first head), all three into the
  workspace.
- `ssd_scan_kernel` (phase 2, grid `(head h, block of head_dim columns)`): walks the chunks
  in order, holding in registers the state of the sequence that runs across each chunk edge
  (`[block_p, N]` f32), and per chunk writes the output rows of its columns,
  `y[t] = sum_{s <= t, seq[s] = seq[t]} CB[t, s] exp(dA_cumsum[t] - dA_cumsum[s]) dt'[s] x[s]`
  `+ exp(dA_cumsum[t]) C[t] . h_start(seq[t]) + D x[t]`
  (`h_start` the state entering the chunk for the first sequence, the initial state for a
  sequence starting inside it; `dA_cumsum` counts from the sequence's first token in the
  chunk, or from the chunk's first token for the sequence running into it), and the final
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

Non-finite values (issue 17): masked positions never reach the arithmetic. Every mask selects
(`jnp.where`) rather than multiplies by 0, `dA_cumsum` is a masked sum per sequence (not a
chunk-wide cumulative sum), and the one product whose masked terms a select cannot reach,
`M @ x` of the intra-chunk output (a 0 weight times a NaN x is NaN), takes x with its
non-finite entries zeroed; only when a row block's source tokens hold such an x, a second
product of the 0/1 causal mask with the 0/1 non-finite flags of x (exact counts) marks the
outputs that reach one, which are set to NaN. So a
NaN in x, dt, B, C or an initial state of one sequence makes NaN exactly the outputs and
final state entries the recurrence makes NaN (that sequence's, at and after the token) and
leaves every other value bit-identical: never an earlier token, never another sequence.
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
    seq_ref,
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

    dt `[T, H]` (raw), a / bias `[H]`, b / c `[T, G, N]`, seq `[Tp]` int32 (each token's
    sequence), ws_in (aliased to ws, unused), ws `[rows, L]` (written). Tokens past T (the
    last chunk's tail) read as 0.

    `dA_cumsum` restarts at every sequence's first token in the chunk:
    `dA[t] = sum_{s <= t in the chunk, seq[s] = seq[t]} dt'[s] A`, a masked sum (select) in
    `[block_l, block_l]` tiles, so a non-finite `dt'` of one sequence never reaches another's
    sums (a chunk-wide cumulative sum would carry it into every later token of the chunk).
    """
    del ws_in_ref  # aliased to ws_ref; only written, through the output ref
    L = chunk_size
    c = pl.program_id(0)
    h = pl.program_id(1)
    g = h // heads_per_group

    rows = functools.partial(_rows, num_tokens=num_tokens, tail=num_tokens % L != 0)

    def dt_of(start, n):
        """dt' of tokens `start .. start + n`."""
        v = rows(dt_ref, start, n, h).astype(jnp.float32) + bias_ref[h]
        if dt_softplus:
            v = _softplus(v)
        v = jnp.minimum(jnp.maximum(v, dt_min), dt_max)
        # Tokens past the end of the stream are padding: dt' = 0 keeps them out of every sum.
        return jnp.where(start + jnp.arange(n) < num_tokens, v, 0.0)

    ws_ref[pl.ds(dt_row + h * num_chunks_ws + c, 1), :] = dt_of(c * L, L)[None, :]
    # dA_cumsum per sequence, in [block_l, block_l] tiles (static loops: L // block_l <= 4).
    nl = L // block_l
    tri = jax.lax.broadcasted_iota(jnp.int32, (block_l, block_l), 0) >= (
        jax.lax.broadcasted_iota(jnp.int32, (block_l, block_l), 1)
    )
    for r in range(nl):
        seq_r = seq_ref[pl.ds(c * L + r * block_l, block_l)][:, None]
        acc = jnp.zeros((block_l,), jnp.float32)
        for k in range(r + 1):
            dta = dt_of(c * L + k * block_l, block_l) * a_ref[h]
            keep = seq_r == seq_ref[pl.ds(c * L + k * block_l, block_l)][None, :]
            if k == r:
                keep = keep & tri
            acc = acc + jnp.sum(jnp.where(keep, dta[None, :], 0.0), axis=1)
        ws_ref[pl.ds(dacs_row + h * num_chunks_ws + c, 1), pl.ds(r * block_l, block_l)] = acc[
            None, :
        ]

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
    `exp(dA[e]) * (s == s0 ? h_in : init[s]) + sum_{t in s, t <= e}
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

            def causal_of(k0):
                seq_k = seq_ref[pl.ds(t0 + k0, bk)][None, :]  # [1, bk]
                col_idx = k0 + jax.lax.broadcasted_iota(jnp.int32, (bl, bk), 1)
                return (row_idx >= col_idx) & (seq_rows == seq_k)

            def diag_body(k, carry):
                acc, num_bad = carry
                k0 = pl.multiple_of(k * bk, bk)
                ks = pl.ds(k0, bk)
                cb = ws_ref[pl.ds(cb_r + r0, bl), ks]  # [bl, bk]
                da_k = ws_ref[pl.ds(da_r, 1), ks]  # [1, bk]
                dt_k = ws_ref[pl.ds(dt_r, 1), ks]  # [1, bk]
                causal = causal_of(k0)
                seg = jnp.where(causal, da_rows - da_k, 0.0)
                m = jnp.where(causal, cb * jnp.exp(seg) * dt_k, 0.0)
                # A 0 weight times a non-finite x is NaN: the product takes x with its
                # non-finite entries zeroed (counted, for `poison` below).
                xk = load(x_ref, t0 + k0, bk, h, pcols).astype(f32)
                ok = jnp.isfinite(xk)
                num_bad = num_bad + jnp.sum(jnp.where(ok, 0.0, 1.0))
                return acc + _dot(m, jnp.where(ok, xk, 0.0)), num_bad

            # Causal: source tokens past this row block contribute nothing.
            nk = (r0 + bl) // bk
            init = (jnp.zeros((bl, bp), f32), jnp.float32(0.0))
            acc, num_bad = jax.lax.fori_loop(0, nk, diag_body, init)

            def poison(acc):
                """NaN where an output reaches a non-finite x causally in its own sequence:
                the 0/1 causal mask times the 0/1 non-finite flags of x (exact counts)."""

                def body(k, reach):
                    k0 = pl.multiple_of(k * bk, bk)
                    xk = load(x_ref, t0 + k0, bk, h, pcols).astype(f32)
                    flags = jnp.where(jnp.isfinite(xk), 0.0, 1.0)
                    return reach + _dot(jnp.where(causal_of(k0), 1.0, 0.0), flags)

                reach = jax.lax.fori_loop(0, nk, body, jnp.zeros((bl, bp), f32))
                return jnp.where(reach > 0.0, jnp.nan, acc)

            # Only when these rows' source tokens hold a non-finite x (rare): no registers or
            # work for it on the common path.
            acc = jax.lax.cond(num_bad > 0.0, poison, lambda a: a, acc)
            # The sequence running at the chunk's start sees h_in.
            first = seq_rows == s0
            scale = jnp.exp(jnp.where(first, da_rows, 0.0))
            acc = acc + jnp.where(first, scale * c_dot_state(rows, h_in), 0.0)
            if has_init:
                # A sequence starting inside the chunk sees its initial state.
                def inner(s, acc):
                    mine = seq_rows == s  # dA_cumsum restarts at the sequence's first token
                    w = jnp.exp(jnp.where(mine, da_rows, 0.0))
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
            end_tok = cu_ref[s + 1]
            e = jnp.minimum(end_tok, t0 + L) - 1 - t0
            # dA_cumsum of the sequence's last token in the chunk (it restarts at its first).
            a_end = _scalar(ws_ref, da_r, jnp.maximum(e, 0))
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
            decay = jnp.exp(a_end)
            state = tuple(decay * a + b for a, b in zip(start, own, strict=True))

            @pl.when((end_tok > start_tok) & (end_tok <= t0 + L))
            def _store():
                for n, v in enumerate(state):
                    final_ref[s, h, pcols, ncols[n]] = v.astype(final_ref.dtype)

            return tuple(jnp.where(s == s_last, a, b) for a, b in zip(state, h_next, strict=True))

        return jax.lax.fori_loop(s0, s_last + 1, seq_state, h_in)

    jax.lax.fori_loop(0, num_chunks, chunk_body, zero_state)
