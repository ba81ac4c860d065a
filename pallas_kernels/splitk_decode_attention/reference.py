"""Plain-`jnp` float32 reference for paged decode attention, independent of the kernel.

Nothing here imports from the kernel folder's other modules: a reference that reuses the
kernel's helpers would cancel the bug it should catch. It gathers every sequence's keys and
values densely through its block table and takes one softmax over all of them: no splits, no
online rescaling.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

__all__ = ["paged_decode_attention_reference", "paged_decode_logits_reference"]

_HI = jax.lax.Precision.HIGHEST


def _gather(cache: jax.Array, block_tables: jax.Array) -> jax.Array:
    """`[num_blocks, bs, Hkv, D]` + `[B, P]` -> `f32[B, P * bs, Hkv, D]` (token order)."""
    pages = jnp.clip(block_tables, 0, cache.shape[0] - 1)
    g = cache[pages].astype(jnp.float32)  # [B, P, bs, Hkv, D]
    b, p, bs, hkv, d = g.shape
    return g.reshape(b, p * bs, hkv, d)


def paged_decode_logits_reference(
    q: jax.Array,
    k_cache: jax.Array,
    block_tables: jax.Array,
    seq_lens: jax.Array,
    *,
    sm_scale: float | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Scaled logits of every query head against every gathered key, and the validity mask.

    Args:
      q: `[B, Hq, D]`; k_cache: `[num_blocks, bs, Hkv, D]`; block_tables: `int[B, P]`;
        seq_lens: `int[B]`; `sm_scale` defaults to `1 / sqrt(D)`.

    Returns:
      `(logits f32[B, Hq, P * bs], valid bool[B, P * bs])`, `valid[b, t] = t < seq_lens[b]`.
      Logits at invalid positions are computed but meaningless.
    """
    B, Hq, D = q.shape
    hkv = k_cache.shape[2]
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    keys = _gather(k_cache, block_tables)  # [B, T, Hkv, D]
    keys = jnp.repeat(keys, Hq // hkv, axis=2)  # [B, T, Hq, D]: head h reads h // (Hq/Hkv)
    logits = jnp.einsum("bhd,bthd->bht", q.astype(jnp.float32), keys, precision=_HI) * scale
    t = jnp.arange(keys.shape[1])
    valid = t[None, :] < seq_lens[:, None]
    return logits, valid


def paged_decode_attention_reference(
    q: jax.Array,
    k_cache: jax.Array,
    v_cache: jax.Array,
    block_tables: jax.Array,
    seq_lens: jax.Array,
    *,
    sm_scale: float | None = None,
) -> jax.Array:
    """`softmax(sm_scale * q . K^T) @ V` over each sequence's first `seq_lens[b]` keys, in f32.

    Shapes as for `paged_decode_logits_reference`, plus v_cache like k_cache. A sequence of
    length 0 gives zeros. Keys and values past `seq_lens[b]` never enter the arithmetic, so
    whatever they hold (NaN included) does not matter; a NaN or infinity in `q` or in a valid
    key or value gives NaN for the heads it reaches (softmax of a NaN is NaN), never 0.

    Returns:
      `f32[B, Hq, D]`.
    """
    B, Hq, D = q.shape
    hkv = v_cache.shape[2]
    logits, valid = paged_decode_logits_reference(
        q, k_cache, block_tables, seq_lens, sm_scale=sm_scale
    )
    values = jnp.repeat(_gather(v_cache, block_tables), Hq // hkv, axis=2)  # [B, T, Hq, D]
    # Select, not multiply: a masked position's weight is 0, but 0 * NaN = NaN, so stale bytes
    # past seq_lens (a NaN from an earlier tenant of the page) must not reach p @ V.
    values = jnp.where(valid[:, :, None, None], values, 0.0)
    masked = jnp.where(valid[:, None, :], logits, -jnp.inf)
    m = jnp.max(masked, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.exp(masked - m)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    out = jnp.einsum("bht,bthd->bhd", p, values, precision=_HI)
    # Only an exactly empty sum (no valid key) gives 0; a NaN sum stays NaN.
    return jnp.where(denom == 0, 0.0, out / jnp.where(denom == 0, 1.0, denom))
