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

__all__ = ["check_y_col0", "lora_bgmv", "lora_expand", "lora_expand_into", "lora_shrink"]

_BLOCK_M = 16  # a decode batch's tile: Triton's smallest dot


def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, 1 << max(0, (n - 1).bit_length())))


def _call(cfg: BgmvConfig, shape: tuple[int, int], dtype: Any, interpret: bool, aliased: bool):
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        functools.partial(lora_bgmv_kernel, cfg=cfg),
        grid=(pl.cdiv(cfg.t, cfg.block_m), pl.cdiv(cfg.n, cfg.block_n)),
        in_specs=[any_spec] * (5 if aliased else 4),
        out_specs=any_spec,
        out_shape=jax.ShapeDtypeStruct(shape, dtype),
        input_output_aliases={4: 0} if aliased else {},
        interpret=interpret,
        # Triton explicitly: jax 0.10 otherwise lowers GPU pallas_calls with Mosaic GPU.
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=1),
        name="lora_bgmv",
    )


def _padded(cfg: BgmvConfig, t: int, cols: int, interpret: bool) -> tuple[int, int]:
    """Interpret mode: whole tiles of output (see the kernel's store); compiled: exact."""
    if not interpret:
        return t, cols
    return (pl.cdiv(t, cfg.block_m) * cfg.block_m,
            max(cols, (cfg.add_at or 0) + pl.cdiv(cfg.n, cfg.block_n) * cfg.block_n))  # fmt: skip


@functools.partial(jax.jit, static_argnames=("cfg", "out_dtype", "interpret"))
def _run(slots, x, w, scale, *, cfg: BgmvConfig, out_dtype: Any, interpret: bool) -> jax.Array:
    rows, cols = _padded(cfg, cfg.t, cfg.n, interpret)
    out = _call(cfg, (rows, cols), out_dtype, interpret, False)(slots, x, w, scale)
    return out[: cfg.t, : cfg.n] if interpret else out


def _into_y(slots, x, w, scale, y, *, cfg: BgmvConfig, interpret: bool) -> jax.Array:
    """The in-place expand's call (`y` aliased to the output), inside the caller's jit."""
    t, ny = y.shape
    rows, cols = _padded(cfg, t, ny, interpret)
    if (rows, cols) != (t, ny):  # interpret mode only
        y_p = jnp.zeros((rows, cols), y.dtype).at[:t, :ny].set(y)
        return _call(cfg, (rows, cols), y.dtype, interpret, True)(slots, x, w, scale, y_p)[:t, :ny]
    return _call(cfg, (t, ny), y.dtype, interpret, True)(slots, x, w, scale, y)


_run_into = jax.jit(_into_y, static_argnames=("cfg", "interpret"), donate_argnums=4)


def check_y_col0(y: Any, t: int, n: int, col0: Any, what: str) -> None:
    """`y [t, n_y]` and a static int `col0` with `col0 + n <= n_y` (ValueError otherwise)."""
    if len(getattr(y, "shape", ())) != 2 or y.shape[0] != t:
        raise ValueError(f"{what}: y must be [{t}, n_y] (one row per token), got "
                         f"{getattr(y, 'shape', type(y))}")  # fmt: skip
    if isinstance(col0, bool) or not isinstance(col0, int) or not 0 <= col0 <= y.shape[1] - n:
        raise ValueError(f"{what}: col0={col0!r} must be an int in "
                         f"[0, {y.shape[1] - n}] (y has {y.shape[1]} columns, b {n})")  # fmt: skip


def lora_bgmv(x: jax.Array, w: jax.Array, scale: jax.Array, slots: jax.Array, *,
              out_dtype: Any = jnp.float32, interpret: bool | None = None,
              what: str = "lora_bgmv") -> jax.Array:  # fmt: skip
    """`out[t] = scale[s] * x[t] @ w[s]^T` for `s = slots[t]`; zero rows where `s == -1`.

    Args:
      x: `[T, K]` (bf16, f16 or f32), the tokens; multiplied in `w`'s dtype (read as they
        are, converted in the kernel: float32 rows holding bf16 values cost no launch).
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
    return _run(slots.astype(jnp.int32), x, w, scale.astype(jnp.float32),
                cfg=cfg, out_dtype=out_dtype, interpret=interp)  # fmt: skip


def lora_shrink(x: jax.Array, a: jax.Array, slots: jax.Array, *, out_dtype: Any = jnp.float32,
                interpret: bool | None = None) -> jax.Array:  # fmt: skip
    """The shrink: `xa[t] = x[t] @ a[slots[t]]^T`, `out_dtype[T, r]` from `x [T, in]` and the
    stacked A weights `a [L, r, in]` (bf16 out: what the arena's `lora_xa` holds); zero rows
    for `slots[t] == -1`."""
    one = jnp.ones((a.shape[0],), jnp.float32) if hasattr(a, "shape") else None
    return lora_bgmv(x, a, one, slots, out_dtype=out_dtype, interpret=interpret,
                     what="lora_shrink")  # fmt: skip


def lora_expand(xa: jax.Array, b: jax.Array, scale: jax.Array, slots: jax.Array, *,
                interpret: bool | None = None) -> jax.Array:  # fmt: skip
    """The expand: `delta[t] = scale[s] * xa[t] @ b[s]^T` for `s = slots[t]`, `float32[T,
    out]` from `xa [T, r]` (the shrink's output) and the stacked B weights `b [L, out, r]`
    (what the arena's `lora_delta` holds, rounded to bf16); zero rows for `s == -1`. The
    caller adds it to the base projection's output."""
    return lora_bgmv(xa, b, scale, slots, interpret=interpret, what="lora_expand")


def lora_expand_into(y: jax.Array, xa: jax.Array, b: jax.Array, scale: jax.Array,
                     slots: jax.Array, *, col0: int = 0,
                     interpret: bool | None = None) -> jax.Array:  # fmt: skip
    """The expand added to a base projection's output in place: for every token `t` with a
    slot `s >= 0`, `y[t, col0:col0 + out] = bf16(bf16(y) + bf16(scale[s] * xa[t] @
    b[s]^T))` (`y` and the delta rounded as bf16 regions hold them, the sum as `y`'s region
    does); the other rows and columns of `y` are not touched (a float32 `y` keeps its
    unrounded values there).

    Args:
      y: `[T, n_y]` (float32 or bf16), donated: the result is written
        into its buffer (no temp of its size); the caller must not reuse `y`.
      xa, b, scale, slots: as for `lora_expand`.
      col0: static; the first column of `y` the delta's column 0 lands on (the k or v range
        of a fused q/k/v output), `col0 + out <= n_y`.

    Returns:
      `y` with the deltas added, same shape and dtype.
    """
    validate(xa, b, scale, slots, "lora_expand_into")
    t, k = xa.shape
    num, n, _ = b.shape
    check_y_col0(y, t, n, col0, "lora_expand_into")
    interp = resolve_interpret(interpret)
    cfg = BgmvConfig(t=t, k=k, n=n, slots=num, block_m=_BLOCK_M, block_n=_pow2(n, 16, 64),
                     block_k=_pow2(k, 16, 64), upcast=interp, add_at=col0)  # fmt: skip
    return _run_into(slots.astype(jnp.int32), xa, b, scale.astype(jnp.float32), y, cfg=cfg,
                     interpret=interp)  # fmt: skip
