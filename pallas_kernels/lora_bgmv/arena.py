"""The batched LoRA matmuls on the arena's `lora_xa` region: the shrink stores its bf16 output
`xa [T, r]` there in place and the expand reads it back from there, so the LoRA path keeps
no `[T, r]` temporary (the seed's layout: `lora_xa` is `bf16[max_batch_tokens, max_rank]`).

How the arena goes in: on a GPU the WHOLE arena, reinterpreted as `uint16[rows, 128]` (an
XLA bitcast of the `uint8[rows, 256]` array, no copy), aliased to the shrink's output; the
expand gets it read-only. The kernels store and load the bf16 values' bits: a float view
would let the interpreter's masked stores canonicalise NaN payloads in bytes that are not
theirs (seen: one byte of a neighbouring element changed). Element offsets stay exact:
Pallas' Triton lowering uses int32 element offsets for arrays of at most 2^32 bytes (at most
2^31 two-byte elements, so a signed int32 holds every one) and 64-bit offsets above; the
kernel adds a static first row to an int32 in-region element index (`T * r < 2^31`,
checked). In interpret mode (CPU) the kernels get
only the region's rows (and, for the shrink, a few scratch rows where masked lanes store),
written back with `dynamic_update_slice`: there a whole-arena operand is copied (the
interpreter carries an aliased operand as input and as output; `_arena_io`).

`lora_delta` is not written: the expand adds each token's `bf16(delta)` into the base
projection's output buffer in place (`lora_expand_into`), inside the kernel. A separate
`[T, out]` delta would be a second pass over memory and, since a fused q/k/v or gate/up
output needs several modules' deltas at once, wider than the region (its width is the widest
single projection).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels._arena_io import ROW_BYTES
from pallas_kernels._args import INT32_MAX, resolve_interpret
from pallas_kernels.lora_bgmv.checks import validate
from pallas_kernels.lora_bgmv.kernel import HALVES, BgmvConfig, RegionAt
from pallas_kernels.lora_bgmv.ops import _BLOCK_M, _call, _into_y, _pow2, check_y_col0

__all__ = ["LORA_XA_REGION", "lora_expand_from_arena", "lora_shrink_into"]

LORA_XA_REGION = "lora_xa"
"""The arena region of the shrink's output (`bf16[max_batch_tokens, max_rank]`)."""

BF16 = jnp.bfloat16
U16 = jnp.uint16


def _halves(b: jax.Array) -> jax.Array:
    """uint8 `[rows, 256]` -> uint16 `[rows, 128]` (an XLA bitcast on the GPU)."""
    return lax.bitcast_convert_type(b.reshape(b.shape[0], HALVES, 2), U16)


def _bytes(h: jax.Array) -> jax.Array:
    """uint16 `[rows, 128]` -> uint8 `[rows, 256]` (an XLA bitcast on the GPU)."""
    return lax.bitcast_convert_type(h, jnp.uint8).reshape(h.shape[0], ROW_BYTES)


def _span(offset_bytes: int, t: int, ld: int) -> tuple[int, int]:
    """The arena rows `[first, end)` holding elements `[0, t * ld)` of a region at
    `offset_bytes`."""
    return offset_bytes // ROW_BYTES, pl.cdiv(offset_bytes + t * ld * 2, ROW_BYTES)


def _region(plan: Any, arena: Any, region: str, t: int, ld: int, what: str) -> int:
    """Checks that `region` holds `bf16[t, ld]` and starts on an arena row; its offset."""
    if not callable(getattr(plan, "check_fits", None)):
        raise ValueError(f"{what}: plan must be a jaxarena.ArenaPlan, got {type(plan).__name__}")
    plan.check_fits((region, (t, ld), BF16, f"xa of {t} tokens at rank {ld}"), arena=arena,
                    what=what)  # fmt: skip
    off = int(plan.regions[region].offset_bytes)
    if off % ROW_BYTES:
        raise ValueError(f"{what}: region {region!r} starts at byte {off}, not on a "
                         f"{ROW_BYTES}-byte arena row; build the plan with align_bytes >= "
                         f"{ROW_BYTES}")  # fmt: skip
    if t * ld > INT32_MAX:
        raise NotImplementedError(f"{what}: {t} x {ld} elements; in-region offsets are int32")
    return off


@functools.partial(jax.jit, static_argnames=("cfg", "offset", "interpret"), donate_argnums=4)
def _shrink(slots, x, w, scale, arena, *, cfg: BgmvConfig, offset: int, interpret: bool):
    n = cfg.n
    if not interpret:
        h = _halves(arena)
        at = RegionAt(offset // ROW_BYTES, n, h.shape[0] - 1)
        cfg = BgmvConfig(**{**cfg.__dict__, "out_at": at})
        h = _call(cfg, h.shape, U16, False, True)(slots, x, w, scale, h)
        return _bytes(h)
    lo, hi = _span(offset, cfg.t, n)
    # Scratch rows past the window for one tile's masked lanes (`RegionAt.dump`).
    dump_rows = pl.cdiv(cfg.block_m * cfg.block_n, HALVES)
    win = jnp.concatenate([_halves(lax.slice(arena, (lo, 0), (hi, ROW_BYTES))),
                           jnp.zeros((dump_rows, HALVES), U16)])  # fmt: skip
    at = RegionAt(0, n, win.shape[0] - 1, dump=(hi - lo) * HALVES)
    cfg = BgmvConfig(**{**cfg.__dict__, "out_at": at})
    win = _call(cfg, win.shape, U16, True, True)(slots, x, w, scale, win)
    return lax.dynamic_update_slice(arena, _bytes(win[: hi - lo]), (lo, 0))


@functools.partial(jax.jit, static_argnames=("cfg", "offset", "interpret"), donate_argnums=4)
def _expand(slots, arena, w, scale, y, *, cfg: BgmvConfig, offset: int, interpret: bool):
    if interpret:
        lo, hi = _span(offset, cfg.t, cfg.k)
        src = _halves(lax.slice(arena, (lo, 0), (hi, ROW_BYTES)))
        row0 = 0
    else:
        src, row0 = _halves(arena), offset // ROW_BYTES
    cfg = BgmvConfig(**{**cfg.__dict__, "x_at": RegionAt(row0, cfg.k, src.shape[0] - 1)})
    return _into_y(slots, src, w, scale, y, cfg=cfg, interpret=interpret)


def lora_shrink_into(arena: jax.Array, plan: Any, x: jax.Array, a: jax.Array,
                     slots: jax.Array, *, region: str = LORA_XA_REGION,
                     interpret: bool | None = None) -> jax.Array:  # fmt: skip
    """The shrink `xa[t] = bf16(x[t] @ a[slots[t]]^T)` stored into the arena's `region`.

    Args:
      arena: the plan's `uint8` arena. Donate it to the enclosing `jax.jit` for the write to
        be in place; use the returned arena afterwards.
      plan: the `jaxarena.ArenaPlan`; `region` (default `lora_xa`) must hold `bf16[T, r]` and
        start on a 256-byte arena row.
      x: `[T, in]` tokens (bf16, f16 or f32), not donated; multiplied in `a`'s dtype.
      a: `[L, r, in]`, the stacked A weights of the `L` slots.
      slots: `int32[T]`, each token's slot in `[-1, L)`; rows of slot -1 are stored as zeros.
      interpret: Pallas interpret mode (None: on a CPU).

    Returns:
      The arena with `xa` (`bf16[T, r]`, row-major) at the start of `region`. The region's
      bytes past `T * r * 2` and every byte outside it are unchanged. Read it with
      `lora_expand_from_arena` (or `plan.view(arena, region, (T, r), bfloat16)`).

    Raises:
      ValueError: what `lora_shrink` rejects; a region too small, missing or not row aligned
        (`ArenaError`, a ValueError); all before any tracing.
    """
    one = jnp.ones((a.shape[0],), jnp.float32) if hasattr(a, "shape") else None
    validate(x, a, one, slots, "lora_shrink_into")
    t, k = x.shape
    num, r, _ = a.shape
    off = _region(plan, arena, region, t, r, "lora_shrink_into")
    if t == 0 or r == 0:
        return arena
    interp = resolve_interpret(interpret)
    cfg = BgmvConfig(t=t, k=k, n=r, slots=num, block_m=_BLOCK_M, block_n=_pow2(r, 16, 64),
                     block_k=_pow2(k, 16, 64), upcast=interp)  # fmt: skip
    return _shrink(slots.astype(jnp.int32), x, a, one, arena, cfg=cfg, offset=off,
                   interpret=interp)  # fmt: skip


def lora_expand_from_arena(y: jax.Array, arena: jax.Array, plan: Any, b: jax.Array,
                           scale: jax.Array, slots: jax.Array, *, col0: int = 0,
                           region: str = LORA_XA_REGION,
                           interpret: bool | None = None) -> jax.Array:  # fmt: skip
    """`lora_expand_into` with `xa` read from the arena's `region` (where `lora_shrink_into`
    stored it): for every token `t` with a slot `s >= 0`, `y[t, col0:col0 + out] =
    bf16(bf16(y) + bf16(scale[s] * xa[t] @ b[s]^T))`; the other elements of `y` are not
    touched.

    Args:
      y: `[T, n_y]` (bf16 or float32), donated: written in place.
      arena: the plan's arena (read only; not donated). Its `region` holds `xa`,
        `bf16[T, r]` row-major at the region's start.
      plan, region: as for `lora_shrink_into`.
      b: `[L, out, r]`, the stacked B weights; scale: `float32[L]`; slots: `int32[T]`.
      col0: static; the first column of `y` the delta's column 0 lands on.
      interpret: Pallas interpret mode (None: on a CPU).

    Returns:
      `y` with the deltas added, same shape and dtype. The caller ties it to the arena
      (`lax.optimization_barrier((y, arena))`) before the arena's next write, so that XLA
      orders this read first instead of copying the arena.

    Raises:
      ValueError: what `lora_expand_into` rejects; a region too small, missing or not row
        aligned; all before any tracing.
    """
    num, n, r = _b_shape(b)
    t = getattr(y, "shape", (0,))[0] if len(getattr(y, "shape", ())) == 2 else None
    if t is None:
        raise ValueError(f"lora_expand_from_arena: y must be [T, n_y], got "
                         f"{getattr(y, 'shape', type(y))}")  # fmt: skip
    xa = jax.ShapeDtypeStruct((t, r), BF16)  # what the region holds, for the shared checks
    validate(xa, b, scale, slots, "lora_expand_from_arena")
    check_y_col0(y, t, n, col0, "lora_expand_from_arena")
    off = _region(plan, arena, region, t, r, "lora_expand_from_arena")
    if t == 0 or n == 0:
        return y
    interp = resolve_interpret(interpret)
    cfg = BgmvConfig(t=t, k=r, n=n, slots=num, block_m=_BLOCK_M, block_n=_pow2(n, 16, 64),
                     block_k=_pow2(r, 16, 64), upcast=interp, add_at=col0)  # fmt: skip
    return _expand(slots.astype(jnp.int32), arena, b, scale.astype(jnp.float32), y, cfg=cfg,
                   offset=off, interpret=interp)  # fmt: skip


def _b_shape(b: Any) -> tuple[int, int, int]:
    # The stacked B weights' shape `[L, out, r]`, or a ValueError naming `b`.
    shape = tuple(getattr(b, "shape", ()))
    if len(shape) != 3:
        raise ValueError(f"b must be the stacked B weights [slots, out, rank] (rank 3), got "
                         f"{shape if hasattr(b, 'shape') else type(b)}")  # fmt: skip
    return shape  # type: ignore[return-value]
