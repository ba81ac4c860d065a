"""Plain-`jnp` float32 references for the Mamba-2 SSD scan, independent of the kernel.

Nothing here imports from the kernel folder's other modules: a reference that reuses the
kernel's helpers would cancel the bug it should catch. Three functions:

- `ssd_sequential_reference`: the recurrence itself, one token at a time (`lax.scan`).
- `ssd_chunked_reference`: the SSD algorithm written plainly (segment sums, chunk states,
  state passing between chunks, inter-chunk output), applied to each sequence on its own,
  chunked from the sequence's first token. It needs concrete `cu_seqlens` (a Python loop).
- `ssd_chunk_quantities`: the per-chunk intermediates of the packed token stream
  (`dt`, `dA_cumsum`, `C B^T`), laid out as the arena's `ssd_scratch` holds them.

Options (issue 15), as mamba_ssm's `mamba_chunk_scan_combined` defines them:
`dt' = clamp(softplus?(dt + dt_bias), *dt_limit)` (clamped always, default `(0, inf)`), `D` of
shape `[H]` or `[H, P]`, and `y = (y_ssm + D x) * silu(z)` with `z [T, H, P]`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["ssd_chunk_quantities", "ssd_chunked_reference", "ssd_sequential_reference"]

_HI = jax.lax.Precision.HIGHEST


_NO_LIMIT = (0.0, float("inf"))


def _processed_dt(dt, dt_bias, dt_softplus, dt_limit=_NO_LIMIT):
    dt = jnp.asarray(dt, jnp.float32)
    if dt_bias is not None:
        dt = dt + jnp.asarray(dt_bias, jnp.float32)[None, :]
    if dt_softplus:
        dt = jax.nn.softplus(dt)
    return jnp.clip(dt, dt_limit[0], dt_limit[1])


def _skip_and_gate(y, x, D, z):
    """`(y + D x) * silu(z)`; `D` is `[H]` or `[H, P]`, `z` is `[T, H, P]` (each optional)."""
    if D is not None:
        Df = jnp.asarray(D, jnp.float32)
        y = y + (Df[None, :, None] if Df.ndim == 1 else Df[None]) * x
    if z is not None:
        y = y * jax.nn.silu(jnp.asarray(z, jnp.float32))
    return y


def _seq_bounds(cu_seqlens, num_tokens):
    if cu_seqlens is None:
        return np.array([0, num_tokens], np.int64)
    return np.asarray(cu_seqlens, np.int64)


def ssd_sequential_reference(
    x,
    dt,
    A,
    B,
    C,
    *,
    D=None,
    dt_bias=None,
    dt_softplus: bool = False,
    initial_states=None,
    cu_seqlens=None,
    z=None,
    dt_limit: tuple[float, float] = _NO_LIMIT,
) -> tuple[jax.Array, jax.Array]:
    """The SSM recurrence, token by token, in float32.

    `x [T, H, P]`, `dt [T, H]`, `A [H]`, `B, C [T, G, N]`, `D [H]` or `[H, P]`, `dt_bias [H]`,
    `z [T, H, P]`, `initial_states [S, H, P, N]`, `cu_seqlens int[S + 1]` (concrete or traced).
    At the first token of each sequence the state is reset to that sequence's initial state
    (zeros if none), then `h = exp(dt' A) h + dt' x B^T` and `y = (h C + D x) * silu(z)`, with
    `dt' = clamp(softplus?(dt + dt_bias), *dt_limit)`.

    Returns `(y [T, H, P] float32, final_states [S, H, P, N] float32)`; a sequence with no
    tokens keeps its initial state.
    """
    T = x.shape[0]
    cu = jnp.array([0, T], jnp.int32) if cu_seqlens is None else jnp.asarray(cu_seqlens)
    return _sequential(
        x, dt, A, B, C, D, z, dt_bias, initial_states, cu,
        dt_softplus=dt_softplus, dt_limit=tuple(map(float, dt_limit)),
    )  # fmt: skip


@functools.partial(jax.jit, static_argnames=("dt_softplus", "dt_limit"))
def _sequential(x, dt, A, B, C, D, z, dt_bias, initial_states, cu, *, dt_softplus, dt_limit):
    x = jnp.asarray(x, jnp.float32)
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    rep = H // G
    Bh = jnp.repeat(jnp.asarray(B, jnp.float32), rep, axis=1)  # [T, H, N]
    Ch = jnp.repeat(jnp.asarray(C, jnp.float32), rep, axis=1)
    dtp = _processed_dt(dt, dt_bias, dt_softplus, dt_limit)
    A = jnp.asarray(A, jnp.float32)
    cu = cu.astype(jnp.int32)
    S = cu.shape[0] - 1
    if initial_states is None:
        init = jnp.zeros((S, H, P, N), jnp.float32)
    else:
        init = jnp.asarray(initial_states, jnp.float32)
    t_idx = jnp.arange(T)
    # Sequence of each token: the last s with cu[s] <= t (skips empty sequences).
    seq = jnp.sum(cu[None, 1:] <= t_idx[:, None], axis=1)
    starts = cu[seq] == t_idx

    def step(carry, inp):
        h, finals = carry
        x_t, dt_t, b_t, c_t, s, start = inp
        h = jnp.where(start, init[s], h)
        decay = jnp.exp(dt_t * A)[:, None, None]
        h = decay * h + (dt_t[:, None] * x_t)[:, :, None] * b_t[:, None, :]
        y_t = jnp.einsum("hpn,hn->hp", h, c_t, precision=_HI)
        finals = finals.at[s].set(h)
        return (h, finals), y_t

    h0 = jnp.zeros((H, P, N), jnp.float32)
    (_, finals), y = jax.lax.scan(step, (h0, init), (x, dtp, Bh, Ch, seq, starts))
    return _skip_and_gate(y, x, D, z), finals


def _segsum(a):
    """`out[..., i, j] = sum(a[..., j+1 : i+1])` for `j <= i`, `-inf` above the diagonal."""
    L = a.shape[-1]
    cs = jnp.cumsum(a, axis=-1)
    diff = cs[..., :, None] - cs[..., None, :]
    lower = jnp.tril(jnp.ones((L, L), bool))
    return jnp.where(lower, diff, -jnp.inf)


def _ssd_one_sequence(xdt, a, B, C, init, chunk_size):
    """SSD for one sequence: `xdt = x * dt' [l, H, P]`, `a = dt' A [l, H]`, `B, C [l, H, N]`."""
    ln, H, P = xdt.shape
    nch = -(-ln // chunk_size)
    pad = nch * chunk_size - ln

    def chunk(v):
        v = jnp.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1))
        return v.reshape((nch, chunk_size) + v.shape[1:])

    X, Bc, Cc = chunk(xdt), chunk(B), chunk(C)
    Ac = chunk(a).transpose(2, 0, 1)  # [H, c, l]
    A_cs = jnp.cumsum(Ac, axis=-1)
    # 1. intra-chunk output
    Lmat = jnp.exp(_segsum(Ac))  # [H, c, l, s]
    y_diag = jnp.einsum("clhn,cshn,hcls,cshp->clhp", Cc, Bc, Lmat, X, precision=_HI)
    # 2. state of each chunk from its own tokens
    decay_states = jnp.exp(A_cs[..., -1:] - A_cs)  # [H, c, l]
    states = jnp.einsum("clhn,hcl,clhp->chpn", Bc, decay_states, X, precision=_HI)
    # 3. state passing between chunks, starting from the initial state
    states = jnp.concatenate([init[None], states], axis=0)  # [c+1, H, P, N]
    decay_chunk = jnp.exp(_segsum(jnp.pad(A_cs[..., -1], ((0, 0), (1, 0)))))  # [H, c+1, c+1]
    new_states = jnp.einsum("hzc,chpn->zhpn", decay_chunk, states, precision=_HI)
    states_in, final = new_states[:-1], new_states[-1]
    # 4. output from the state entering each chunk
    y_off = jnp.einsum("clhn,chpn,hcl->clhp", Cc, states_in, jnp.exp(A_cs), precision=_HI)
    y = (y_diag + y_off).reshape(nch * chunk_size, H, P)[:ln]
    return y, final


def ssd_chunked_reference(
    x,
    dt,
    A,
    B,
    C,
    *,
    chunk_size: int = 64,
    D=None,
    dt_bias=None,
    dt_softplus: bool = False,
    initial_states=None,
    cu_seqlens=None,
    z=None,
    dt_limit: tuple[float, float] = _NO_LIMIT,
) -> tuple[jax.Array, jax.Array]:
    """The chunked SSD algorithm in plain `jnp`, float32, one sequence at a time.

    Same arguments and results as `ssd_sequential_reference`, but `cu_seqlens` must be
    concrete. Each sequence is cut out of the packed stream and chunked from its own first
    token (zero-padded at its end to a common whole number of chunks, where `dt' = 0` changes
    nothing), so chunk edges differ from the packed-stream chunks the kernel uses: agreement
    checks the kernel's sequence-boundary handling, not a shared layout.
    """
    T = x.shape[0]
    cu = _seq_bounds(cu_seqlens, T)
    S = len(cu) - 1
    lens = np.diff(cu)
    width = max(1, -(-int(lens.max()) // chunk_size)) * chunk_size
    # Token index of position j of sequence s, or T (a zero row) past its end.
    idx = np.full((S, width), T, np.int32)
    for s in range(S):
        idx[s, : lens[s]] = np.arange(cu[s], cu[s + 1])
    valid = idx < T
    idx, valid = jnp.asarray(idx), jnp.asarray(valid)
    return _chunked(
        x,
        dt,
        A,
        B,
        C,
        D,
        z,
        dt_bias,
        initial_states,
        idx,
        valid,
        chunk_size=chunk_size,
        dt_softplus=dt_softplus,
        dt_limit=tuple(map(float, dt_limit)),
    )


@functools.partial(jax.jit, static_argnames=("chunk_size", "dt_softplus", "dt_limit"))
def _chunked(
    x, dt, A, B, C, D, z, dt_bias, initial_states, idx, valid, *, chunk_size, dt_softplus, dt_limit
):
    x = jnp.asarray(x, jnp.float32)
    T, H, P = x.shape
    G, N = B.shape[1], B.shape[2]
    S = idx.shape[0]
    rep = H // G
    Bh = jnp.repeat(jnp.asarray(B, jnp.float32), rep, axis=1)
    Ch = jnp.repeat(jnp.asarray(C, jnp.float32), rep, axis=1)
    dtp = _processed_dt(dt, dt_bias, dt_softplus, dt_limit)
    a = dtp * jnp.asarray(A, jnp.float32)[None, :]
    xdt = x * dtp[:, :, None]
    # Non-finite inputs never reach the masked sums (a 0 weight times NaN is NaN, which would
    # reach earlier tokens): they are zeroed here, and the outputs the recurrence makes NaN are
    # made NaN afterwards. A non-finite x[t, h, p] or dt'[t, h] reaches rows p of the state of
    # its sequence from token t on, B[t, g, n] its column n; every y of the sequence from t on
    # sums over the state's columns; C[t, g] reaches y[t] only.
    bad_rows = ~(jnp.isfinite(xdt) & jnp.isfinite(a)[:, :, None])  # [T, H, P]
    bad_cols = ~jnp.isfinite(Bh)  # [T, H, N]
    row_only = ~jnp.isfinite(Ch).all(-1)  # [T, H]
    xdt = jnp.where(jnp.isfinite(xdt), xdt, 0.0)
    a = jnp.where(jnp.isfinite(a), a, 0.0)
    Bh = jnp.where(jnp.isfinite(Bh), Bh, 0.0)
    Ch = jnp.where(jnp.isfinite(Ch), Ch, 0.0)
    if initial_states is None:
        init = jnp.zeros((S, H, P, N), jnp.float32)
    else:
        init = jnp.asarray(initial_states, jnp.float32)

    def rows(v):  # [T, ...] -> [S, width, ...], zero rows past each sequence's end
        v = jnp.concatenate([v, jnp.zeros((1,) + v.shape[1:], v.dtype)], axis=0)
        return v[idx]

    one = functools.partial(_ssd_one_sequence, chunk_size=chunk_size)
    ys, finals = jax.vmap(one)(rows(xdt), rows(a), rows(Bh), rows(Ch), init)

    # Each sequence is one row here, so a cumulative count along it is "at or after the token".
    def reached(bad):  # [T, H, K] -> [S, width, H, K]: a bad token at or before this one
        return jnp.cumsum(rows(bad).astype(jnp.int32), axis=1) > 0

    r_rows, r_cols = reached(bad_rows), reached(bad_cols)
    poison_y = r_rows | r_cols.any(-1)[..., None] | rows(row_only)[..., None]
    ys = jnp.where(poison_y, jnp.nan, ys)
    finals = jnp.where(r_rows[:, -1, :, :, None] | r_cols[:, -1, :, None, :], jnp.nan, finals)
    # Scatter each sequence's outputs back to its tokens (the padding rows go to row T).
    y = jnp.zeros((T + 1, H, P), jnp.float32).at[jnp.where(valid, idx, T)].set(ys)[:T]
    return _skip_and_gate(y, x, D, z), finals


def ssd_chunk_quantities(
    dt,
    A,
    B,
    C,
    *,
    chunk_size: int = 64,
    dt_bias=None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = _NO_LIMIT,
    cu_seqlens=None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The packed stream's per-chunk intermediates, in float32.

    The token stream `[T]` is cut into `nc = ceil(T / chunk_size)` chunks from token 0
    (tokens past `T` count as `dt' = 0`, `B = C = 0`). Returns
    `dt' [H, nc, L]`, `dA_cumsum [H, nc, L]` (inclusive cumulative sum of `dt' A` within each
    chunk, restarting at the first token of every sequence of `cu_seqlens` (concrete; absent:
    one sequence)) and `CB [nc, G, L, L]` with `CB[c, g, i, j] = C[cL + i, g] . B[cL + j, g]`.
    """
    T, H = dt.shape
    G, N = B.shape[1], B.shape[2]
    L = chunk_size
    nc = -(-T // L)
    pad = nc * L - T
    dtp = jnp.pad(_processed_dt(dt, dt_bias, dt_softplus, dt_limit), ((0, pad), (0, 0)))
    dtp = dtp.reshape(nc, L, H).transpose(2, 0, 1)
    dA_cs = jnp.cumsum(dtp * jnp.asarray(A, jnp.float32)[:, None, None], axis=-1)
    # Restart at each sequence's first token: subtract the chunk's sum before that token.
    cu = _seq_bounds(cu_seqlens, T)
    pos = np.arange(nc * L)
    # Start of t's sequence (the last s with cu[s] <= t; tokens past T join the last sequence)
    first = cu[np.minimum(np.searchsorted(cu, pos, side="right") - 1, len(cu) - 2)]
    first = np.maximum(first, pos - pos % L)  # ... or of t's chunk
    before = (first - 1).reshape(nc, L) % L  # index in the chunk of the token before it
    has_before = (first % L != 0).reshape(nc, L)
    base = jnp.take_along_axis(dA_cs, jnp.asarray(before)[None], axis=-1)
    dA_cs = dA_cs - jnp.where(jnp.asarray(has_before)[None], base, 0.0)
    Bc = jnp.pad(jnp.asarray(B, jnp.float32), ((0, pad), (0, 0), (0, 0))).reshape(nc, L, G, N)
    Cc = jnp.pad(jnp.asarray(C, jnp.float32), ((0, pad), (0, 0), (0, 0))).reshape(nc, L, G, N)
    CB = jnp.einsum("cign,cjgn->cgij", Cc, Bc, precision=_HI)
    return dtp, dA_cs, CB
