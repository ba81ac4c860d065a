"""Kernel body of the Mamba-2 one-token state update (the algorithm only; see `ops.py`).

One program per `(row b, head h, block j of head_dim rows)`. It reads the slot
`s = state_indices[b]` and updates the tile `state[s, h, j*bp : (j+1)*bp, :]` in place:

    dt' = clamp(softplus?(dt[b, h] + dt_bias[h]), lo, hi)
    tile = exp(dt' A[h]) * tile + (dt' x[b, h, rows])[:, None] * B[b, g, :][None, :]
    y[b, h, rows] = sum(tile * C[b, g, :][None, :], axis=1) + D[h, rows] * x[b, h, rows]
    y *= z * sigmoid(z)                         (with z)

all in float32; the tile is rounded to the cache's dtype only when stored, and `y` uses the
unrounded float32 tile (as vLLM's `selective_state_update` does). The state dim `N` is walked
in power-of-two column pieces (`96 = 64 + 32`), so any `N` works without padding the cache;
`bp` is a power of two dividing `P`. A slot outside `[0, S)` (possible only for a traced
`state_indices`; concrete ones are checked by the wrapper) is clamped for the load, never
stored to, and gives `y = NaN` for that row: the cache is never written out of bounds and the
bad row never looks like a plausible output.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["StateUpdateConfig", "ssd_state_update_kernel"]


@dataclasses.dataclass(frozen=True)
class StateUpdateConfig:
    """Static parameters of the kernel (hashable: part of the jit cache key)."""

    num_slots: int
    heads_per_group: int
    block_p: int
    n_pieces: tuple[tuple[int, int], ...]  # (first column, width) of each state-dim piece
    dt_softplus: bool
    dt_min: float
    dt_max: float
    has_bias: bool
    d_per_row: bool  # D is [H, P] (else [H])
    has_d: bool
    has_z: bool


def _softplus(v):
    # mamba_ssm's / vLLM's threshold: above 20, softplus(v) == v in f32.
    return jnp.where(v > 20.0, v, jnp.log1p(jnp.exp(jnp.minimum(v, 20.0))))


def ssd_state_update_kernel(*refs, cfg: StateUpdateConfig):
    """One `(b, h, j)` program.

    Refs, in order (floats in any of f32 / bf16 / f16, converted to f32 here): idx
    `int32[Bt]`; x `[Bt, H, P]`; dt `[Bt, H]`; A `[H]`; dt_bias `[H]` (with `has_bias`);
    B, C `[Bt, G, N]`; D `[H, P]` or `[H]` (with `has_d`); z `[Bt, H, P]` (with `has_z`); state_in `[S, H, P, N]` (aliased to state_out: read here, written through the
    output); then the outputs y `[Bt, H, P]` and state_out.
    """
    refs = list(refs)
    idx_ref, x_ref, dt_ref, a_ref = (refs.pop(0) for _ in range(4))
    bias_ref = refs.pop(0) if cfg.has_bias else None
    b_ref, c_ref = refs.pop(0), refs.pop(0)
    d_ref = refs.pop(0) if cfg.has_d else None
    z_ref = refs.pop(0) if cfg.has_z else None
    state_in_ref, y_ref, state_out_ref = refs
    f32 = jnp.float32

    b, h, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    g = h // cfg.heads_per_group
    rows = pl.ds(j * cfg.block_p, cfg.block_p)

    slot = idx_ref[b]
    ok = (slot >= 0) & (slot < cfg.num_slots)
    slot = jnp.clip(slot, 0, cfg.num_slots - 1)

    dt = dt_ref[b, h].astype(f32)
    if cfg.has_bias:
        dt = dt + bias_ref[h].astype(f32)
    if cfg.dt_softplus:
        dt = _softplus(dt)
    dt = jnp.minimum(jnp.maximum(dt, cfg.dt_min), cfg.dt_max)
    decay = jnp.exp(dt * a_ref[h].astype(f32))

    x = x_ref[b, h, rows].astype(f32)  # [bp]
    dx = (dt * x)[:, None]
    y = jnp.zeros((cfg.block_p,), f32)
    for n0, w in cfg.n_pieces:
        cols = pl.ds(n0, w)
        tile = state_in_ref[slot, h, rows, cols].astype(f32)  # [bp, w]
        bv = b_ref[b, g, cols].astype(f32)
        cv = c_ref[b, g, cols].astype(f32)
        tile = decay * tile + dx * bv[None, :]
        y = y + jnp.sum(tile * cv[None, :], axis=1)
        plgpu.store(
            state_out_ref.at[slot, h, rows, cols],
            tile.astype(state_out_ref.dtype),
            mask=jnp.broadcast_to(ok, tile.shape),
        )
    if cfg.has_d:
        d = d_ref[h, rows] if cfg.d_per_row else d_ref[h]
        y = y + d.astype(f32) * x
    if cfg.has_z:
        zv = z_ref[b, h, rows].astype(f32)
        y = y * (zv / (1.0 + jnp.exp(-zv)))
    y = jnp.where(ok, y, jnp.nan)
    y_ref[b, h, rows] = y.astype(y_ref.dtype)
