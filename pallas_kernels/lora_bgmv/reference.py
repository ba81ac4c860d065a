"""Plain-`jnp` reference of the batched LoRA matmul, in float32; imports nothing from the
kernel."""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["lora_bgmv_reference"]


def lora_bgmv_reference(x: jax.Array, w: jax.Array, scale: jax.Array,
                        slots: jax.Array) -> jax.Array:  # fmt: skip
    """`out[t] = scale[s] * x[t] @ w[s]^T` with `s = slots[t]`, zero where `s` is outside
    `[0, L)`: `float32[T, N]` from `x [T, K]`, `w [L, N, K]`, `scale [L]`, `slots int32[T]`."""
    num = w.shape[0]
    ok = (slots >= 0) & (slots < num)
    s = jnp.clip(slots, 0, num - 1)
    prod = jnp.einsum("tk,tnk->tn", x.astype(jnp.float32), w.astype(jnp.float32)[s],
                      precision=jax.lax.Precision.HIGHEST)  # fmt: skip
    return jnp.where(ok[:, None], prod * scale.astype(jnp.float32)[s][:, None], 0.0)
