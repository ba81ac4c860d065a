"""The LoRA path of a projection: each token's adapter delta added to the base output.

A block's LoRA tables (`params["lora"]`, made by `jaxarena.models.lora`) hold, per target
module, `a` (`bf16[L, r, in]`), `b` (`bf16[L, out, r]`) and `scale` (`float32[L]`) for the `L`
adapter slots, zero-padded to the model's `max_lora_rank` r (exact: padded rank columns add
zeros). A step's tokens carry their slot in `StepContext.lora_slots` (-1: the base model).

`lora_add` adds `scale * (x @ A^T) @ B^T` to the base outputs with the batched kernels
(`pallas_kernels.lora_bgmv`), rounded as the seed's regions would hold them. Per adapted
module, the shrink stores `xa` (bf16 `[T, r]`) into the arena's `lora_xa` region in place
(the whole arena aliased) and the expand reads it back from there, adding `bf16(delta)` into
the base output's buffer in place (on its column range of a fused output); the sum is
rounded as the base output's region would hold it. So the path allocates nothing that grows
with T: no `[T, r]` temp, no `[T, out]` delta.

`lora_delta` is sized by the plan but not written: the delta never needs to exist on its own.
The expand adds it to the base output inside the kernel, where it is a register tile; a
stored delta would cost a second pass (write, then read back for the add), and a fused q/k/v
or gate/up output, whose modules' deltas are all live until the sum is made, needs more
columns than the region has (its width is the widest single projection's).

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

from jaxarena import ArenaPlan
from jaxarena.models.core.arena import BF16, F32
from pallas_kernels.lora_bgmv import lora_expand_from_arena, lora_shrink_into

__all__ = ["lora_add", "lora_tables"]


def lora_tables(params: dict[str, Any], slots: jax.Array | None) -> dict[str, Any] | None:
    """The block's LoRA tables when it has them and the step carries slots; else None."""
    if slots is None or "lora" not in params:
        return None
    return params["lora"]


def _add(plan: ArenaPlan, arena: jax.Array, y: jax.Array, tab: dict[str, jax.Array],
         x: jax.Array, slots: jax.Array, col0: int,
         interpret: bool | None) -> tuple[jax.Array, jax.Array]:  # fmt: skip
    # The shrink reads `x` as bf16 (its values): the same buffer the base GEMM reads (XLA
    # merges the two converts), where float32 rows would be a `[T, in]` f32 buffer of their
    # own (measured: 16 MiB for o_proj's input at 2048 tokens of Qwen3-0.6B, 24 MiB for
    # down_proj's). It stores bf16 `xa` into `lora_xa`; the expand reads it there and adds
    # into `y`'s buffer in place.
    arena = lora_shrink_into(arena, plan, x.astype(BF16), tab["a"], slots, interpret=interpret)
    y = lora_expand_from_arena(y, arena, plan, tab["b"], tab["scale"], slots, col0=col0,
                               interpret=interpret)  # fmt: skip
    # The expand read the arena: tie its output to the arena so that the next write (the
    # next module's shrink) waits for it instead of XLA copying the arena (as `linear`).
    y, arena = jax.lax.optimization_barrier((y, arena))
    return arena, y


def lora_add(plan: ArenaPlan, arena: jax.Array, ys: Sequence[jax.Array], x: jax.Array,
             groups: Sequence[Sequence[Any]], slots: jax.Array, *, rounded: bool = True,
             interpret: bool | None = None) -> tuple[jax.Array, tuple[jax.Array, ...]]:  # fmt: skip
    """Base outputs plus their LoRA deltas.

    Args:
      plan, arena: the model's plan and its newest arena (its `lora_xa` region holds each
        module's `xa` in turn; `adapter_max_rank` sizes it).
      ys: the base projections' outputs, `float32[T, n_i]` (bf16-rounded values).
      x: their input, `float32[T, in]` holding bf16 values, or bf16 (every `ys[i]` has this
        input).
      groups: per output, its column ranges in order: each a module's table
        (`{"a", "b", "scale"}`) or an int, a width of columns no adapter touches (the fused
        `wqkv` output is `[(q table), (k table), (v table)]`).
      slots: `int32[T]`, each token's adapter slot (-1: none).
      rounded: True: `ys` hold bf16 values and go through the in-place expand as bf16 (the
        GEMM's bf16 output buffer, not a float32 copy of it). False: `ys` stay float32 and
        the rows of tokens without an adapter keep their unrounded values (`o_proj`: the
        base model's rows as the step without LoRA gives them); the expand adds into the
        GEMM's float32 buffer, so no bf16 copy of it exists beside it.
      interpret: Pallas interpret mode (None: on a CPU).

    Returns:
      `(arena, outputs)`: the arena with `lora_xa` written, and the float32 outputs,
      `bf16(bf16(y) + bf16(delta))` in the rows of tokens with an adapter, the other rows
      unchanged.
    """
    out = []
    for y, group in zip(ys, groups, strict=True):
        y = y.astype(BF16) if rounded else y
        col0 = 0
        for g in group:
            if isinstance(g, int):
                col0 += g
                continue
            arena, y = _add(plan, arena, y, g, x, slots, col0, interpret)
            col0 += g["b"].shape[1]
        out.append(y.astype(F32))
    return arena, tuple(out)
