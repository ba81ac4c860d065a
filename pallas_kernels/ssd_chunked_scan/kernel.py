"""Kernel bodies of the Mamba-2 SSD chunked scan (the algorithm only; see `ops.py`).

The per-chunk kernels run on a grid `(chunk c, head h)` over a packed token stream cut into
chunks of `L = chunk_size` tokens from token 0. Every token carries the index of its sequence
(`seq`, non-decreasing), so a chunk may hold the tail of one sequence, whole short sequences
and the head of the next one.

- `ssd_cumsum_cb_kernel` (phase 1a): `dt'`, the within-chunk inclusive cumulative sum
  `dA_cumsum` of `dt' A`, and `CB = C B^T` of the head's group (stored by the group's first
  head), all three into the workspace.
- `ssd_chunk_kernel` (phase 1b): reads them back and computes the intra-chunk output
  `y_diag[t] = sum_{s <= t, seq[s] = seq[t]} CB[t, s] exp(dA_cumsum[t] - dA_cumsum[s]) dt'[s]
  x[s]`, and the chunk's own contribution to the state of its last sequence,
  `state = sum_{seq[t] = seq[L-1]} exp(dA_cumsum[L-1] - dA_cumsum[t]) dt'[t] x[t]^T B[t]`.
- `ssd_state_passing_kernel` (phase 2, grid `(head, block of state elements)`): walks the
  chunks in order inside the kernel, carrying the state of the sequence that runs across each
  chunk edge, so the number of launches does not depend on the number of chunks.
- `ssd_output_kernel` (phase 3): adds, for the tokens of the sequence that is running when
  the chunk starts, `exp(dA_cumsum[t]) C[t] . h_in`, and `D x`.

Register budget (sm_90a): every matrix product is an f32 `tl.dot` at IEEE precision, which
Triton lowers to FMAs with each thread holding its rows and columns of BOTH operands over the
whole contraction. The kernels therefore contract in slices of `block_k` (tokens) or
`block_n` (state columns) inside a loop, and keep accumulators at most `[64, 64]`, so no
kernel spills at P = 64, N = 128, L = 64 (ptxas, sm_90a, 4 warps: 96-100 registers for the
chunk kernels, 40 for the state passing; tests/test_gpu_aot_ssd.py checks it).

The workspace is a 2-D f32 array `[rows, L]` (the flat scratch seen as rows of `L`): `dt'` of
(chunk c, head h) is row `dt_row + h * num_chunks_ws + c`, `dA_cumsum` row
`dacs_row + h * num_chunks_ws + c`, and `CB` of (chunk c, group g) is the `L` rows from
`cb_row + (c * num_groups + g) * L`. The kernels see the whole workspace (no block spec)
and address it with dynamic row slices, so one aliased buffer holds all three sections.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

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
    block_n: int,
):
    """Phase 1a for one (chunk, head). Refs (blocks):

    dt `[L]` (raw), a / bias `[H]` (whole), b / c `[L, N]` (this head's group), ws_in (aliased
    to ws, unused), ws `[rows, L]` (whole, written).
    """
    del ws_in_ref  # aliased to ws_ref; only written, through the output ref
    L = chunk_size
    c = pl.program_id(0)
    h = pl.program_id(1)
    g = h // heads_per_group
    pos = c * L + jnp.arange(L)

    dt = dt_ref[...].astype(jnp.float32) + bias_ref[h]
    if dt_softplus:
        dt = _softplus(dt)
    # Tokens past the end of the stream are padding: dt' = 0 keeps them out of every sum.
    dt = jnp.where(pos < num_tokens, dt, 0.0)
    dA_cs = jnp.cumsum(dt * a_ref[h])
    ws_ref[pl.ds(dt_row + h * num_chunks_ws + c, 1), :] = dt[None, :]
    ws_ref[pl.ds(dacs_row + h * num_chunks_ws + c, 1), :] = dA_cs[None, :]

    # CB depends on the group only: the group's first head stores it.
    @pl.when(h % heads_per_group == 0)
    def _store_cb():
        num_n = b_ref.shape[1] // block_n

        def body(j, acc):
            cols = pl.ds(pl.multiple_of(j * block_n, block_n), block_n)
            cm = c_ref[:, cols].astype(jnp.float32)
            bm = b_ref[:, cols].astype(jnp.float32)
            return acc + _dot(cm, bm, _NT)

        cb = jax.lax.fori_loop(0, num_n, body, jnp.zeros((L, L), jnp.float32))
        ws_ref[pl.ds(cb_row + (c * num_groups + g) * L, L), :] = cb


def ssd_chunk_kernel(
    x_ref,
    b_ref,
    seq_ref,
    ws_ref,
    y_diag_ref,
    state_ref,
    *,
    chunk_size: int,
    num_chunks_ws: int,
    heads_per_group: int,
    num_groups: int,
    dt_row: int,
    dacs_row: int,
    cb_row: int,
    block_k: int,
    block_n: int,
):
    """Phase 1b for one (chunk, head). Refs (blocks):

    x `[L, P]`, b `[L, N]` (this head's group), seq `[L]` int32, ws `[rows, L]` (whole,
    read: dt', dA_cumsum and CB of phase 1a), y_diag `[L, P]` f32, state `[P, N]` f32.
    """
    L = chunk_size
    c = pl.program_id(0)
    h = pl.program_id(1)
    g = h // heads_per_group
    dt_r = dt_row + h * num_chunks_ws + c
    da_r = dacs_row + h * num_chunks_ws + c
    cb_r = cb_row + (c * num_groups + g) * L
    num_k = L // block_k

    # Row-side quantities of the whole chunk, as columns [L, 1].
    seq_all = seq_ref[...]
    seq_col = seq_all[:, None]
    da_col = jnp.transpose(ws_ref[pl.ds(da_r, 1), :])  # [L, 1]
    row_idx = jax.lax.broadcasted_iota(jnp.int32, (L, block_k), 0)

    # y_diag, contracted over the source tokens s in slices of block_k.
    def diag_body(k, acc):
        k0 = pl.multiple_of(k * block_k, block_k)
        ks = pl.ds(k0, block_k)
        cb = ws_ref[pl.ds(cb_r, L), ks]  # [L, bk]
        da_k = ws_ref[pl.ds(da_r, 1), ks]  # [1, bk]
        dt_k = ws_ref[pl.ds(dt_r, 1), ks]  # [1, bk]
        seq_k = seq_ref[ks][None, :]  # [1, bk]
        col_idx = k0 + jax.lax.broadcasted_iota(jnp.int32, (L, block_k), 1)
        causal = (row_idx >= col_idx) & (seq_col == seq_k)
        seg = jnp.where(causal, da_col - da_k, 0.0)
        m = jnp.where(causal, cb * jnp.exp(seg), 0.0) * dt_k
        return acc + _dot(m, x_ref[ks, :].astype(jnp.float32))

    P = x_ref.shape[1]
    y_diag_ref[...] = jax.lax.fori_loop(0, num_k, diag_body, jnp.zeros((L, P), jnp.float32))

    # The chunk's state: only its last sequence carries a state into the next chunk.
    s_last = jnp.max(seq_all)
    total = jnp.sum(ws_ref[pl.ds(da_r, 1), pl.ds(L - 1, 1)])

    def state_cols(j, carry):
        cols = pl.ds(pl.multiple_of(j * block_n, block_n), block_n)

        def state_body(k, acc):
            ks = pl.ds(pl.multiple_of(k * block_k, block_k), block_k)
            da_k = jnp.transpose(ws_ref[pl.ds(da_r, 1), ks])  # [bk, 1]
            dt_k = jnp.transpose(ws_ref[pl.ds(dt_r, 1), ks])
            last = (seq_ref[ks] == s_last)[:, None]  # [bk, 1]
            w = jnp.where(last, jnp.exp(jnp.where(last, total - da_k, 0.0)), 0.0)
            bw = b_ref[ks, cols].astype(jnp.float32) * (w * dt_k)
            return acc + _dot(x_ref[ks, :].astype(jnp.float32), bw, _TN)

        acc = jnp.zeros((P, block_n), jnp.float32)
        state_ref[:, cols] = jax.lax.fori_loop(0, num_k, state_body, acc)
        return carry

    jax.lax.fori_loop(0, state_ref.shape[1] // block_n, state_cols, 0)


def ssd_state_passing_kernel(
    states_ref,
    decay_ref,
    meta_ref,
    init_ref,
    h_ref,
    *,
    num_chunks: int,
    block: int,
):
    """Phase 2 for one (head h, block j of `block` state elements). Refs (whole arrays):

    states (aliased to h, unused: read through h), decay `[H, nc]` f32 (the decay of chunk c
    over the part that carries a state: from the last sequence's start, or the chunk start,
    to the chunk end), meta `[4, nc]` int32 (rows: the chunk's first sequence continues from
    the previous chunk; its last sequence starts strictly inside it; the first sequence; the
    last sequence), init `[S, H, E]` f32 (each sequence's initial state, `E = P * N`
    flattened), h `[nc, H, E]` f32: on entry each chunk's own contribution to the state of
    its last sequence, on exit the state of the sequence running at each chunk's first
    token, before it (`h_in`). Chunk c's slot is read before it is overwritten, by the same
    program through the same ref, so the update in place needs no second buffer.

    Per chunk, in order: `h_in = continues ? h_run : init[first]`, then
    `h_run = decay * (fresh ? init[last] : h_in) + states[c]`.
    """
    del states_ref  # aliased to h_ref
    h = pl.program_id(0)
    cols = pl.ds(pl.multiple_of(pl.program_id(1) * block, block), block)

    def body(c, h_run):
        own = h_ref[c, h, cols]
        cont = meta_ref[0, c] != 0
        fresh = meta_ref[1, c] != 0
        h_in = jnp.where(cont, h_run, init_ref[meta_ref[2, c], h, cols])
        h_ref[c, h, cols] = h_in
        h_start = jnp.where(fresh, init_ref[meta_ref[3, c], h, cols], h_in)
        return decay_ref[h, c] * h_start + own

    jax.lax.fori_loop(0, num_chunks, body, jnp.zeros((block,), jnp.float32))


def ssd_output_kernel(
    x_ref,
    c_ref,
    seq_ref,
    y_diag_ref,
    h_in_ref,
    ws_ref,
    d_ref,
    y_ref,
    *,
    chunk_size: int,
    num_chunks_ws: int,
    dacs_row: int,
    has_d: bool,
    block_n: int,
):
    """Phase 3 for one (chunk, head). Refs (blocks):

    x `[L, P]`, c `[L, N]`, seq `[L]` int32, y_diag `[L, P]` f32 (intra-chunk output plus the
    initial-state terms of sequences that start inside the chunk), h_in `[P, N]` f32 (state
    of the sequence running at the chunk's first token, before that token), ws `[rows, L]`
    (whole, read), d `[H]` (whole), y `[L, P]` in the output dtype.
    """
    c = pl.program_id(0)
    h = pl.program_id(1)
    L = chunk_size
    P = x_ref.shape[1]

    # C . h_in, contracted over the state columns in slices of block_n.
    def body(j, acc):
        cols = pl.ds(pl.multiple_of(j * block_n, block_n), block_n)
        return acc + _dot(c_ref[:, cols].astype(jnp.float32), h_in_ref[:, cols], _NT)

    y_off = jax.lax.fori_loop(0, c_ref.shape[1] // block_n, body, jnp.zeros((L, P), jnp.float32))
    dA_cs = ws_ref[pl.ds(dacs_row + h * num_chunks_ws + c, 1), :]  # [1, L]
    seq = seq_ref[...]
    s0 = jnp.min(seq)
    # Tokens of a sequence that starts inside this chunk do not see h_in.
    first = (seq == s0)[None, :]
    scale = jnp.where(first, jnp.exp(jnp.where(first, dA_cs, 0.0)), 0.0)  # [1, L]
    y = y_diag_ref[...] + jnp.transpose(scale) * y_off
    if has_d:
        y = y + d_ref[h] * x_ref[...].astype(jnp.float32)
    y_ref[...] = y.astype(y_ref.dtype)
