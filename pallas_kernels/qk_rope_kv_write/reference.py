"""Independent plain-`jnp` reference of the fused decode write (imports nothing from the
kernel): the same operations written as whole-array float32 steps and an indexed update."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["qk_rope_kv_write_reference"]


def _stored(x: jax.Array, dtype: Any, scale: Any) -> jax.Array:
    x = x.astype(jnp.bfloat16)
    if jnp.dtype(dtype) != jnp.dtype(jnp.float8_e4m3fn):
        return x.astype(dtype)
    s = jnp.asarray(scale, jnp.float32).reshape(-1)
    y = x.astype(jnp.float32) / jnp.broadcast_to(s, (x.shape[1],))[:, None]
    return jnp.clip(y, -448.0, 448.0).astype(dtype)


def qk_rope_kv_write_reference(qkv, k_cache, v_cache, positions, block_tables, *, num_q_heads,
                               q_norm=None, k_norm=None, eps=1e-6, norm_offset=0.0,
                               inv_freq=None, rope_scaling=1.0, k_scale=None,
                               v_scale=None) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """`qk_rope_kv_write`'s result `(q bf16[T, Hq, D], k_cache, v_cache)` (see its
    docstring); rows whose table entry lies outside the cache are dropped."""
    nb, bs, hkv, d = k_cache.shape
    hq = num_q_heads
    if qkv.ndim == 3:  # split-K partials: their sum, rounded as the step stores it
        parts = qkv.astype(jnp.float32)
        acc = parts[0]
        for s in range(1, parts.shape[0]):  # in order 0..S-1, as specified
            acc = acc + parts[s]
        qkv = acc.astype(jnp.bfloat16)
    t = qkv.shape[0]
    x = qkv.astype(jnp.float32).reshape(t, hq + 2 * hkv, d)
    q, k, v = x[:, :hq], x[:, hq : hq + hkv], x[:, hq + hkv :]

    def norm(y, w):
        ms = jnp.mean(jnp.square(y), axis=-1, keepdims=True)
        return y / jnp.sqrt(ms + eps) * (w.astype(jnp.float32) + norm_offset)

    if q_norm is not None:
        q, k = norm(q, q_norm), norm(k, k_norm)
    if inv_freq is not None:
        inv = jnp.asarray(inv_freq, jnp.float32)
        half = inv.shape[0]
        ang = positions.astype(jnp.float32)[:, None, None] * inv
        c, s = jnp.cos(ang) * rope_scaling, jnp.sin(ang) * rope_scaling

        def rot(y):
            a, b = y[..., :half], y[..., half : 2 * half]
            return jnp.concatenate([a * c - b * s, b * c + a * s, y[..., 2 * half :]], -1)

        q, k = rot(q), rot(k)
    pos = positions.astype(jnp.int32)
    page = block_tables[jnp.arange(t), jnp.clip(pos // bs, 0, block_tables.shape[1] - 1)]
    rows = page * bs + pos % bs
    rows = jnp.where((rows >= 0) & (rows < nb * bs), rows, nb * bs)  # past the end: dropped
    flat = (nb * bs, hkv, d)
    kc = k_cache.reshape(flat).at[rows].set(_stored(k, k_cache.dtype, k_scale), mode="drop")
    vc = v_cache.reshape(flat).at[rows].set(_stored(v, v_cache.dtype, v_scale), mode="drop")
    return q.astype(jnp.bfloat16), kc.reshape(k_cache.shape), vc.reshape(v_cache.shape)
