"""The LoRA path of a projection: each token's adapter delta added to the base output.

A block's LoRA tables (`params["lora"]`, made by `jaxarena.models.lora`) hold, per target
module, `a` (`bf16[L, r, in]`), `b` (`bf16[L, out, r]`) and `scale` (`float32[L]`) for the `L`
adapter slots, zero-padded to the model's `max_lora_rank` r (exact: padded rank columns add
zeros). A step's tokens carry their slot in `StepContext.lora_slots` (-1: the base model).

`lora_add` adds `scale * (x @ A^T) @ B^T` to the base outputs with the batched kernels
(`pallas_kernels.lora_bgmv`), rounded as the seed's regions would hold them: the shrink
output as `lora_xa` (bf16), the expand output as `lora_delta` (bf16), the sum as the base
output's region. The base GEMM is untouched; the whole LoRA path sits in one `lax.cond` on
"any token has a slot", so a step whose batch uses no adapter pays that reduction and the
conditional only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from jaxarena.models.core.arena import BF16, stored
from pallas_kernels.lora_bgmv import lora_expand, lora_shrink

__all__ = ["lora_add", "lora_tables"]


def lora_tables(params: dict[str, Any], slots: jax.Array | None) -> dict[str, Any] | None:
    """The block's LoRA tables when it has them and the step carries slots; else None."""
    if slots is None or "lora" not in params:
        return None
    return params["lora"]


def _delta(tab: dict[str, jax.Array], x: jax.Array, slots: jax.Array,
           interpret: bool | None) -> jax.Array:  # fmt: skip
    xa = stored(lora_shrink(x.astype(BF16), tab["a"], slots, interpret=interpret))
    d = lora_expand(xa.astype(BF16), tab["b"], tab["scale"], slots, interpret=interpret)
    return stored(d)


def lora_add(ys: Sequence[jax.Array], x: jax.Array, groups: Sequence[Sequence[Any]],
             slots: jax.Array, *, interpret: bool | None = None) -> tuple[jax.Array, ...]:  # fmt: skip
    """Base outputs plus their LoRA deltas.

    Args:
      ys: the base projections' outputs, `float32[T, n_i]` (bf16-rounded values).
      x: their input, `float32[T, in]` (every `ys[i]` has this input).
      groups: per output, its column ranges in order: each a module's table
        (`{"a", "b", "scale"}`) or an int, a width of columns no adapter touches (the fused
        `wqkv` output is `[(q table), (k table), (v table)]`).
      slots: `int32[T]`, each token's adapter slot (-1: none).
      interpret: Pallas interpret mode (None: on a CPU).

    Returns:
      The outputs, each `stored(y + delta)` where a token has an adapter; unchanged (the
      same values) when no token of the step has one.
    """
    t = x.shape[0]

    def on(ys):
        out = []
        for y, group in zip(ys, groups, strict=True):
            parts = [jnp.zeros((t, g), jnp.float32) if isinstance(g, int)
                     else _delta(g, x, slots, interpret) for g in group]  # fmt: skip
            d = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=1)
            out.append(stored(y + d))
        return tuple(out)

    return lax.cond(jnp.any(slots >= 0), on, tuple, tuple(ys))
