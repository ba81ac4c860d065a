"""RMSNorm, the one normalisation the blocks use (block pre-norm, q/k norm, Mamba gate norm,
final norm)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["rms_norm", "inv_rms"]


def inv_rms(x: jax.Array, eps: float) -> jax.Array:
    """`1 / sqrt(mean(x^2, last axis) + eps)`, the last axis kept as 1 (`[..., 1]`): the
    factor `rms_norm` multiplies `x` by, for a caller that takes it in a pass of its own."""
    return jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + eps)


def rms_norm(x: jax.Array, w: jax.Array, eps: float, offset: float = 0.0,
             scale: jax.Array | None = None) -> jax.Array:  # fmt: skip
    """`x / sqrt(mean(x^2, last axis) + eps) * (w + offset)`, in the dtype of `x` (float32
    here). `offset=1` is the zero-centred form of Qwen3-Next / Qwen3.5 (`(1 + w)`, the sum
    taken in float32). `scale`: `inv_rms(x, eps)` already taken (the same numbers)."""
    if offset:
        w = w.astype(jnp.float32) + offset
    if scale is None:
        scale = inv_rms(x, eps)
    return x * scale * w
