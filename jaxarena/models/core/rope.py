"""Rotary position embeddings (the rotate-half form of Llama / Qwen3)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["rope", "rope_frequencies", "rope_table"]


def rope(x: jax.Array, positions: jax.Array, theta: float, rotary_dim: int = 0) -> jax.Array:
    """Rotary embedding (rotate-half form) of `x [T, heads, D]` at `positions int32[T]`;
    float32 angles `positions * theta^(-2i/d)` over the first `d = rotary_dim` values of each
    head (0: all `D`; partial RoPE, Qwen3-Next / Qwen3.5), the rest passed through."""
    if rotary_dim and rotary_dim < x.shape[-1]:
        rot = rope(x[..., :rotary_dim], positions, theta)
        return jnp.concatenate([rot, x[..., rotary_dim:]], -1)
    d = x.shape[-1]
    inv = rope_frequencies(theta, d)
    ang = positions.astype(jnp.float32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang)[:, None, :], jnp.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def rope_frequencies(theta: float, d: int) -> jax.Array:
    """`float32[d / 2]` inverse frequencies `theta^(-2i/d)` of `rope` over `d` rotated
    channels (the fused decode write takes the same table, so the same numbers)."""
    return theta ** (-jnp.arange(0, d // 2, dtype=jnp.float32) * 2 / d)


def rope_table(x: jax.Array, positions: jax.Array, inv_freq: tuple[float, ...],
               scaling: float = 1.0) -> jax.Array:  # fmt: skip
    """Rotary embedding (rotate-half form) of the first `2 * len(inv_freq)` channels of
    `x [T, heads, D]` at `positions int32[T]`, with float32 angles `positions * inv_freq` and
    cos / sin multiplied by `scaling`; the remaining channels pass through (partial rotary).
    `inv_freq` and `scaling` come from `jaxarena.models.core.rope_params.rope_spec`."""
    r = 2 * len(inv_freq)
    inv = jnp.asarray(inv_freq, jnp.float32)
    ang = positions.astype(jnp.float32)[:, None] * inv[None, :]
    cos, sin = jnp.cos(ang)[:, None, :] * scaling, jnp.sin(ang)[:, None, :] * scaling
    x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
    out = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if r < x.shape[-1]:
        out.append(x[..., r:])
    return jnp.concatenate(out, -1)
