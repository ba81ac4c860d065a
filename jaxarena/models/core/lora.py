"""The LoRA path of a projection: each token's adapter delta added to the base output.

A block's LoRA tables (`params["lora"]`, made by `jaxarena.models.lora`) hold, per target
module, `a` (`bf16[L, r, in]`), `b` (`bf16[L, out, r]`) and `scale` (`float32[L]`) for the `L`
adapter slots, zero-padded to the model's `max_lora_rank` r (exact: padded rank columns add
zeros). A step's tokens carry their slot in `StepContext.lora_slots` (-1: the base model).

`lora_add` adds `scale * (x @ A^T) @ B^T` to the base outputs with the batched kernels
(`pallas_kernels.lora_bgmv`), rounded as the seed's regions would hold them: the shrink
output as `lora_xa` (bf16), the expand output as `lora_delta` (bf16, inside the kernel), the
sum as the base output's region. The expand adds into the base output's buffer in place (on
its column range of a fused output), so the path's only temp is the `[T, r]` shrink output.
The base GEMM is untouched, and the path runs only in a step that carries slots: the callers
decide on the host, passing no slots for a batch that uses no adapter (the engine runs its
plain executables then, `CausalLM` compiles its step without them), so such a batch runs the
base model's step, launch for launch. (A device-side `lax.cond` on "any token has a slot"
did that job before: it cost a batch without adapters ~16 launches per layer, its
pass-through branches' copies and the fusions it split; jaxarena/models/README.md.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax

from jaxarena.models.core.arena import BF16, F32
from pallas_kernels.lora_bgmv import lora_expand_into, lora_shrink

__all__ = ["lora_add", "lora_tables"]


def lora_tables(params: dict[str, Any], slots: jax.Array | None) -> dict[str, Any] | None:
    """The block's LoRA tables when it has them and the step carries slots; else None."""
    if slots is None or "lora" not in params:
        return None
    return params["lora"]


def _add(y: jax.Array, tab: dict[str, jax.Array], x: jax.Array, slots: jax.Array, col0: int,
         interpret: bool | None) -> jax.Array:  # fmt: skip
    # The shrink reads the float32 rows (bf16 values) as they are and writes bf16, the
    # rounding `lora_xa` would store; the expand adds into `y`'s buffer in place.
    xa = lora_shrink(x, tab["a"], slots, out_dtype=BF16, interpret=interpret)
    return lora_expand_into(y, xa, tab["b"], tab["scale"], slots, col0=col0,
                            interpret=interpret)  # fmt: skip


def lora_add(ys: Sequence[jax.Array], x: jax.Array, groups: Sequence[Sequence[Any]],
             slots: jax.Array, *,
             interpret: bool | None = None) -> tuple[jax.Array, ...]:  # fmt: skip
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
      The outputs, `bf16(y + bf16(delta))` in the rows of tokens with an adapter, the other
      rows unchanged.
    """
    out = []
    # The outputs go through the in-place expand as bf16, the values they hold: a GEMM's
    # bf16 output buffer, not a float32 copy of it.
    for y, group in zip(ys, groups, strict=True):
        y = y.astype(BF16)
        col0 = 0
        for g in group:
            if isinstance(g, int):
                col0 += g
                continue
            y = _add(y, g, x, slots, col0, interpret)
            col0 += g["b"].shape[1]
        out.append(y.astype(F32))
    return tuple(out)
