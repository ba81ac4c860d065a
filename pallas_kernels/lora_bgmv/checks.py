"""Argument checks of the batched LoRA matmuls, before any tracing: ranks, dtypes and
matching sizes (ValueError naming the argument and showing the value)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from pallas_kernels._args import array_shape, is_concrete

__all__ = ["validate"]

_FLOATS = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32))


def _float(name: str, v: Any, rank: int, layout: str) -> tuple[int, ...]:
    shape = array_shape(name, v)
    if len(shape) != rank:
        raise ValueError(f"{name} must be {layout} (rank {rank}), got shape {shape}")
    if jnp.dtype(v.dtype) not in _FLOATS:
        raise ValueError(f"{name}.dtype={v.dtype} must be bfloat16, float16 or float32")
    return shape


def validate(x: Any, w: Any, scale: Any, slots: Any, what: str) -> None:
    """Checks `x [T, K]`, `w [L, N, K]`, `scale [L]` and `slots int32[T]` of `what` (the
    op's name, for the messages); concrete slots must lie in `[-1, L)`."""
    t, k = _float("x", x, 2, f"{what}'s input [tokens, depth]")
    num, _, wk = _float("w", w, 3, f"{what}'s weights [slots, out, depth]")
    if wk != k:
        raise ValueError(f"{what}: w's depth {wk} (shape {tuple(w.shape)}) must equal x's "
                         f"{k} (shape {tuple(x.shape)})")  # fmt: skip
    if tuple(array_shape("scale", scale)) != (num,):
        raise ValueError(f"{what}: scale must be [{num}] (one per slot), got "
                         f"{tuple(scale.shape)}")  # fmt: skip
    sshape = tuple(array_shape("slots", slots))
    if sshape != (t,) or not jnp.issubdtype(slots.dtype, jnp.integer):
        raise ValueError(f"{what}: slots must be int32[{t}] (one per token), got "
                         f"{slots.dtype}{list(sshape)}")  # fmt: skip
    if is_concrete(slots):
        s = np.asarray(slots)
        bad = s[(s < -1) | (s >= num)]
        if bad.size:
            raise ValueError(f"{what}: slots {bad[:5].tolist()} outside [-1, {num}) "
                             "(-1: no adapter)")  # fmt: skip
