"""Kernel bodies of the Mamba-2 SSD chunked scan (the algorithm only; see `ops.py`).

Both kernels run on a grid `(chunk c, head h)` over a packed token stream cut into chunks of
`L = chunk_size` tokens from token 0. Every token carries the index of its sequence
(`seq`, non-decreasing), so a chunk may hold the tail of one sequence, whole short sequences
and the head of the next one.

- `ssd_chunk_kernel` (phase 1): `dt'`, the within-chunk inclusive cumulative sum
  `dA_cumsum` of `dt' A`, `CB = C B^T` (stored into the workspace), the intra-chunk output
  `y_diag[t] = sum_{s <= t, seq[s] = seq[t]} CB[t, s] exp(dA_cumsum[t] - dA_cumsum[s]) dt'[s]
  x[s]`, and the chunk's own contribution to the state of its last sequence,
  `state = sum_{seq[t] = seq[L-1]} exp(dA_cumsum[L-1] - dA_cumsum[t]) dt'[t] x[t]^T B[t]`.
- `ssd_output_kernel` (phase 3, after the state passing): adds, for the tokens of the
  sequence that is running when the chunk starts, `exp(dA_cumsum[t]) C[t] . h_in`, and `D x`.

The workspace is a 2-D f32 array `[rows, L]` (the flat scratch seen as rows of `L`): `dt'` of
(chunk c, head h) is row `dt_row + h * num_chunks_ws + c`, `dA_cumsum` row
`dacs_row + h * num_chunks_ws + c`, and `CB` of (chunk c, group g) is the `L` rows from
`cb_row + (c * num_groups + g) * L`. Both kernels see the whole workspace (no block spec)
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


def _last(v, n):
    """`v[n - 1]` of a 1-D value, as a reduction (Triton cannot index a tensor value)."""
    idx = jnp.arange(n)
    return jnp.sum(jnp.where(idx == n - 1, v, 0.0))


def ssd_chunk_kernel(
    x_ref,
    dt_ref,
    a_ref,
    bias_ref,
    b_ref,
    c_ref,
    seq_ref,
    ws_in_ref,
    ws_ref,
    y_diag_ref,
    state_ref,
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
):
    """Phase 1 for one (chunk, head). Refs (blocks):

    x `[L, P]`, dt `[L]` (raw), a / bias `[H]` (whole), b / c `[L, N]` (this head's group),
    seq `[L]` int32, ws_in (aliased to ws, unused), ws `[rows, L]` (whole, written),
    y_diag `[L, P]` f32, state `[P, N]` f32.
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

    x = x_ref[...].astype(jnp.float32)
    b = b_ref[...].astype(jnp.float32)
    cmat = c_ref[...].astype(jnp.float32)
    seq = seq_ref[...]

    cb = jax.lax.dot_general(cmat, b, _NT, precision=_HI, preferred_element_type=jnp.float32)

    idx = jnp.arange(L)
    causal = (idx[:, None] >= idx[None, :]) & (seq[:, None] == seq[None, :])
    seg = jnp.where(causal, dA_cs[:, None] - dA_cs[None, :], 0.0)
    m = jnp.where(causal, cb * jnp.exp(seg), 0.0) * dt[None, :]
    y_diag_ref[...] = jnp.dot(m, x, precision=_HI, preferred_element_type=jnp.float32)

    # Only the chunk's last sequence carries a state into the next chunk.
    s_last = jnp.max(seq)
    total = _last(dA_cs, L)
    w = jnp.where(seq == s_last, jnp.exp(jnp.where(seq == s_last, total - dA_cs, 0.0)), 0.0)
    bw = b * (w * dt)[:, None]
    state_ref[...] = jax.lax.dot_general(
        x, bw, _TN, precision=_HI, preferred_element_type=jnp.float32
    )

    ws_ref[pl.ds(dt_row + h * num_chunks_ws + c, 1), :] = dt[None, :]
    ws_ref[pl.ds(dacs_row + h * num_chunks_ws + c, 1), :] = dA_cs[None, :]

    # CB depends on the group only: the group's first head stores it.
    @pl.when(h % heads_per_group == 0)
    def _store_cb():
        ws_ref[pl.ds(cb_row + (c * num_groups + g) * L, L), :] = cb


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
):
    """Phase 3 for one (chunk, head). Refs (blocks):

    x `[L, P]`, c `[L, N]`, seq `[L]` int32, y_diag `[L, P]` f32 (intra-chunk output plus the
    initial-state terms of sequences that start inside the chunk), h_in `[P, N]` f32 (state
    of the sequence running at the chunk's first token, before that token), ws `[rows, L]`
    (whole, read), d `[H]` (whole), y `[L, P]` in the output dtype.
    """
    c = pl.program_id(0)
    h = pl.program_id(1)
    dA_cs = ws_ref[pl.ds(dacs_row + h * num_chunks_ws + c, 1), :]  # [1, L]
    seq = seq_ref[...]
    s0 = jnp.min(seq)
    cmat = c_ref[...].astype(jnp.float32)
    y_off = jax.lax.dot_general(
        cmat, h_in_ref[...], _NT, precision=_HI, preferred_element_type=jnp.float32
    )
    # Tokens of a sequence that starts inside this chunk do not see h_in.
    first = (seq == s0)[None, :]
    scale = jnp.where(first, jnp.exp(jnp.where(first, dA_cs, 0.0)), 0.0)  # [1, L]
    y = y_diag_ref[...] + jnp.transpose(scale) * y_off
    if has_d:
        y = y + d_ref[h] * x_ref[...].astype(jnp.float32)
    y_ref[...] = y.astype(y_ref.dtype)
