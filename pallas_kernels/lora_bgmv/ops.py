"""The batched LoRA ops: `lora_shrink` (`x @ A_slot^T`) and `lora_expand`
(`xa @ B_slot^T * scale_slot`), each token with its own adapter slot (-1: none); the
validating wrappers around one `pallas_call` (`kernel.py`)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from pallas_kernels._args import resolve_interpret
from pallas_kernels.lora_bgmv.checks import validate
from pallas_kernels.lora_bgmv.kernel import BgmvConfig, lora_bgmv_kernel

__all__ = ["lora_bgmv", "lora_expand", "lora_shrink"]

_BLOCK_M = 16  # a decode batch's tile: Triton's smallest dot


def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, 1 << max(0, (n - 1).bit_length())))


@functools.partial(jax.jit, static_argnames=("cfg", "out_dtype", "interpret"))
def _run(slots, x, w, scale, *, cfg: BgmvConfig, out_dtype: Any, interpret: bool) -> jax.Array:
    rows = pl.cdiv(cfg.t, cfg.block_m) * cfg.block_m if interpret else cfg.t
    n_tiles = pl.cdiv(cfg.n, cfg.block_n)
    cols = n_tiles * cfg.block_n if interpret else cfg.n
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    out = pl.pallas_call(
        functools.partial(lora_bgmv_kernel, cfg=cfg),
        grid=(pl.cdiv(cfg.t, cfg.block_m), n_tiles),
        in_specs=[any_spec] * 4,
        out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct((rows, cols), out_dtype),
        interpret=interpret,
        # Triton explicitly: jax 0.10 otherwise lowers GPU pallas_calls with Mosaic GPU.
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        name="lora_bgmv",
    )(slots, x, w, scale)
    return out[: cfg.t, : cfg.n] if interpret else out


def lora_bgmv(x: jax.Array, w: jax.Array, scale: jax.Array, slots: jax.Array, *,
              out_dtype: Any = jnp.float32, interpret: bool | None = None,
              what: str = "lora_bgmv") -> jax.Array:  # fmt: skip
    """`out[t] = scale[s] * x[t] @ w[s]^T` for `s = slots[t]`; zero rows where `s == -1`.

    Args:
      x: `[T, K]` (bf16, f16 or f32), the tokens.
      w: `[L, N, K]`, one weight per adapter slot (zero padding past an adapter's rank is
        exact).
      scale: `float32[L]`, each slot's factor.
      slots: `int32[T]`, each token's slot in `[-1, L)`.
      out_dtype: the output's dtype (the kernel accumulates in float32).
      interpret: Pallas interpret mode (None: on a CPU).

    Returns:
      `out_dtype[T, N]`, a new buffer (nothing is donated).

    Raises:
      ValueError: a bad rank, dtype or size (named), or concrete slots outside `[-1, L)`.
    """
    validate(x, w, scale, slots, what)
    t, k = x.shape
    num, n, _ = w.shape
    interp = resolve_interpret(interpret)
    cfg = BgmvConfig(t=t, k=k, n=n, slots=num, block_m=_BLOCK_M, block_n=_pow2(n, 16, 64),
                     block_k=_pow2(k, 16, 64), upcast=interp)  # fmt: skip
    return _run(slots.astype(jnp.int32), x, w.astype(x.dtype), scale.astype(jnp.float32),
                cfg=cfg, out_dtype=out_dtype, interpret=interp)  # fmt: skip


def lora_shrink(x: jax.Array, a: jax.Array, slots: jax.Array, *,
                interpret: bool | None = None) -> jax.Array:  # fmt: skip
    """The shrink: `xa[t] = x[t] @ a[slots[t]]^T`, `float32[T, r]` from `x [T, in]` and the
    stacked A weights `a [L, r, in]` (what the arena's `lora_xa` holds, rounded to bf16);
    zero rows for `slots[t] == -1`."""
    one = jnp.ones((a.shape[0],), jnp.float32) if hasattr(a, "shape") else None
    return lora_bgmv(x, a, one, slots, interpret=interpret, what="lora_shrink")


def lora_expand(xa: jax.Array, b: jax.Array, scale: jax.Array, slots: jax.Array, *,
                interpret: bool | None = None) -> jax.Array:  # fmt: skip
    """The expand: `delta[t] = scale[s] * xa[t] @ b[s]^T` for `s = slots[t]`, `float32[T,
    out]` from `xa [T, r]` (the shrink's output) and the stacked B weights `b [L, out, r]`
    (what the arena's `lora_delta` holds, rounded to bf16); zero rows for `s == -1`. The
    caller adds it to the base projection's output."""
    return lora_bgmv(xa, b, scale, slots, interpret=interpret, what="lora_expand")
