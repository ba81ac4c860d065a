"""RMSNorm, the one normalisation the blocks use (block pre-norm, q/k norm, Mamba gate norm,
final norm)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["rms_norm"]


def rms_norm(x: jax.Array, w: jax.Array, eps: float, offset: float = 0.0) -> jax.Array:
    """`x / sqrt(mean(x^2, last axis) + eps) * (w + offset)`, in the dtype of `x` (float32
    here). `offset=1` is the zero-centred form of Qwen3-Next / Qwen3.5 (`(1 + w)`, the sum
    taken in float32)."""
    if offset:
        w = w.astype(jnp.float32) + offset
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w
