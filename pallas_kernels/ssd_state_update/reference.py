"""Plain-`jnp` float32 reference of the Mamba-2 one-token state update.

Independent of the kernel: nothing here imports from `kernel.py` or `ops.py`. It is written
the direct way (gather the slots, update, scatter back) with no tiling, no masking and no
in-place tricks, so a tiling or indexing bug of the kernel shows up as a difference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["ssd_state_update_reference"]

_HI = jax.lax.Precision.HIGHEST


def ssd_state_update_reference(
    state,
    x,
    dt,
    A,
    B,
    C,
    *,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus: bool = False,
    state_indices=None,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> tuple[jax.Array, jax.Array]:
    """One token per sequence: `h = exp(dt' A) h + dt' x B^T`, `y = h C + D x`, `y *= silu(z)`.

    `state [S, H, P, N]`, `x [Bt, H, P]`, `dt [Bt, H]`, `A [H]`, `B, C [Bt, G, N]`,
    `D [H]` or `[H, P]`, `z [Bt, H, P]`, `dt_bias [H]`, `state_indices int[Bt]` (row `b`
    updates slot `state_indices[b]`; slot `b` without it). `dt' = dt + dt_bias`, then softplus
    with `dt_softplus`, then clamped to `dt_limit` (always, as mamba_ssm's fused path).

    `y` is computed from the float32 updated state, before it is rounded to the cache's
    dtype. Returns `(y [Bt, H, P] float32, new_state [S, H, P, N] in state.dtype)`; slots no
    row names keep their values.
    """
    f32 = jnp.float32
    Bt, H, P = x.shape
    G = B.shape[1]
    idx = jnp.arange(Bt) if state_indices is None else jnp.asarray(state_indices)
    dtp = jnp.asarray(dt, f32)
    if dt_bias is not None:
        dtp = dtp + jnp.asarray(dt_bias, f32)[None, :]
    if dt_softplus:
        dtp = jax.nn.softplus(dtp)
    dtp = jnp.clip(dtp, dt_limit[0], dt_limit[1])  # [Bt, H]
    Bh = jnp.repeat(jnp.asarray(B, f32), H // G, axis=1)  # [Bt, H, N]
    Ch = jnp.repeat(jnp.asarray(C, f32), H // G, axis=1)
    xf = jnp.asarray(x, f32)
    h = jnp.asarray(state, f32)[idx]  # [Bt, H, P, N]
    decay = jnp.exp(dtp * jnp.asarray(A, f32)[None, :])
    h = decay[:, :, None, None] * h + (dtp[:, :, None] * xf)[..., None] * Bh[:, :, None, :]
    y = jnp.einsum("bhpn,bhn->bhp", h, Ch, precision=_HI)
    if D is not None:
        Df = jnp.asarray(D, f32)
        Df = Df[:, None] if Df.ndim == 1 else Df
        y = y + Df[None] * xf
    if z is not None:
        y = y * jax.nn.silu(jnp.asarray(z, f32))
    new_state = jnp.asarray(state).at[idx].set(h.astype(state.dtype))
    return y, new_state
