"""Kernel body of the Gated DeltaNet one-token state update (the algorithm only; see `ops.py`).

One program per `(row b, value head h, block j of value columns)`. It reads the slot
`s = state_indices[b]` and updates the tile `state[s, h, :, cols]` (`[K, block_v]`) in place:

    tile *= exp(g[b, h])
    v' = beta[b, h] (v[b, h, cols] - tile^T k)          k = k[b, h // (HV / H)]
    tile += k v'^T
    o[b, h, cols] = tile^T (scale q)

all in float32 (q and k L2-normalised first with `l2norm`); the tile is rounded to the cache's
dtype only when stored and `o` uses the float32 tile. A slot outside `[0, S)` (possible only
for traced indices) is clamped for the load, never stored to, and gives `o = NaN`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

__all__ = ["GdnUpdateConfig", "gdn_state_update_kernel"]


@dataclasses.dataclass(frozen=True)
class GdnUpdateConfig:
    """Static parameters of the kernel (hashable: part of the jit cache key)."""

    num_slots: int
    heads_per_key_head: int
    block_v: int
    scale: float
    l2norm: bool


def _vec(ref, b, h, cfg):
    x = ref[b, h, :].astype(jnp.float32)
    if cfg.l2norm:
        x = x * jax.lax.rsqrt(jnp.sum(x * x) + 1e-6)
    return x


def gdn_state_update_kernel(idx_ref, q_ref, k_ref, v_ref, g_ref, beta_ref, state_in_ref,
                            o_ref, state_ref, *, cfg: GdnUpdateConfig):  # fmt: skip
    """One `(b, h, j)` program. Refs: idx `int32[B]`, q / k `[B, H, K]`, v `[B, HV, V]`,
    g / beta `[B, HV]`, state_in (aliased to state: read here, written through state), o `[B, HV, V]` and state
    `[S, HV, K, V]` (written)."""
    b, h, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    hk = h // cfg.heads_per_key_head
    cols = pl.ds(pl.multiple_of(j * cfg.block_v, cfg.block_v), cfg.block_v)
    slot = idx_ref[b]
    ok = (slot >= 0) & (slot < cfg.num_slots)
    slot = jnp.clip(slot, 0, cfg.num_slots - 1)
    f32 = jnp.float32

    k = _vec(k_ref, b, hk, cfg)
    q = _vec(q_ref, b, hk, cfg) * cfg.scale
    tile = state_in_ref[slot, h, :, cols].astype(f32) * jnp.exp(g_ref[b, h].astype(f32))
    v = v_ref[b, h, cols].astype(f32)
    v_new = beta_ref[b, h].astype(f32) * (v - jnp.sum(tile * k[:, None], axis=0))
    tile = tile + k[:, None] * v_new[None, :]
    o = jnp.sum(tile * q[:, None], axis=0)
    plgpu.store(
        state_ref.at[slot, h, :, cols],
        tile.astype(state_ref.dtype),
        mask=jnp.broadcast_to(ok, tile.shape),
    )
    o_ref[b, h, cols] = jnp.where(ok, o, jnp.nan).astype(o_ref.dtype)
