"""RMSNorm, the one normalisation the blocks use (block pre-norm, q/k norm, Mamba gate norm,
final norm)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["rms_norm"]


def rms_norm(x: jax.Array, w: jax.Array, eps: float) -> jax.Array:
    """`x / sqrt(mean(x^2, last axis) + eps) * w`, in the dtype of `x` (float32 here)."""
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps) * w
