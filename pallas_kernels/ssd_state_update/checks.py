"""Argument checks of `ssd_state_update`: shapes, dtypes, the state indices and `dt_limit`,
all before tracing (ValueError naming the argument; NotImplementedError for an unsupported
floating dtype)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pallas_kernels._args import (
    check_finite,
    check_float,
    check_nonempty,
    check_rank,
    is_concrete,
    is_int,
)

__all__ = ["validate"]

_FLOATS = (jnp.float32, jnp.bfloat16, jnp.float16)


def _check_dtype(name: str, v: Any) -> None:
    check_float(name, v)
    if jnp.dtype(v.dtype) not in [jnp.dtype(d) for d in _FLOATS]:
        raise NotImplementedError(
            f"{name}.dtype={v.dtype} is not supported; use float32, bfloat16 or float16"
        )


def _check_shape(name: str, v: Any, want: tuple[int, ...], layout: str) -> None:
    if v is None:
        return
    shape = check_rank(name, v, len(want), layout)
    if shape != want:
        raise ValueError(f"{name}.shape={shape} must be {layout} = {want}")
    check_float(name, v)


def _as_indices(state_indices: Any) -> Any:
    """A list/tuple of ints becomes an int32 array (entries checked); arrays pass through."""
    if isinstance(state_indices, list | tuple):
        for i, s in enumerate(state_indices):
            if not is_int(s):
                raise ValueError(f"state_indices[{i}]={s!r} must be an int, got {type(s).__name__}")
        return np.asarray(state_indices, np.int64)
    return state_indices


def _check_indices(idx: Any, rows: int, slots: int) -> None:
    shape = check_rank("state_indices", idx, 1, "[Bt] (one state slot per row of x)")
    if shape[0] != rows:
        raise ValueError(
            f"state_indices.shape={shape} must be [Bt] = ({rows},): one slot per row of x"
        )
    if not jnp.issubdtype(jnp.dtype(idx.dtype), jnp.integer):
        raise ValueError(f"state_indices.dtype={idx.dtype} must be an integer dtype")
    if not is_concrete(idx):
        return  # traced: checked in the kernel only as far as bounds go (see the docstring)
    v = np.asarray(idx).astype(np.int64)
    bad = np.nonzero((v < 0) | (v >= slots))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"state_indices[{i}]={int(v[i])} is outside [0, {slots}) (the cache has {slots} "
            f"slots); a padding slot such as vLLM's PAD_SLOT_ID=-1 is not supported: pass only "
            f"the rows to update"
        )
    uniq, first, counts = np.unique(v, return_index=True, return_counts=True)
    if (counts > 1).any():
        k = int(np.nonzero(counts > 1)[0][0])
        rows_of = np.nonzero(v == uniq[k])[0][:2].tolist()
        raise ValueError(
            f"state_indices repeats slot {int(uniq[k])} (rows {rows_of[0]} and {rows_of[1]}): "
            f"each row must update its own slot (two rows updating one slot would race)"
        )


def _check_limit(dt_limit: Any) -> tuple[float, float]:
    ok = isinstance(dt_limit, Sequence) and len(dt_limit) == 2
    ok = ok and all(isinstance(v, int | float | np.integer | np.floating) for v in dt_limit)
    ok = ok and not any(isinstance(v, bool) for v in dt_limit)
    if not ok:
        raise ValueError(f"dt_limit={dt_limit!r} must be a pair of numbers (lo, hi)")
    lo, hi = float(dt_limit[0]), float(dt_limit[1])
    if math.isnan(lo) or math.isnan(hi) or lo > hi:
        raise ValueError(f"dt_limit={dt_limit!r} must satisfy lo <= hi (no NaN)")
    return lo, hi


def validate(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    *,
    D: Any,
    z: Any,
    dt_bias: Any,
    dt_softplus: Any,
    state_indices: Any,
    dt_limit: Any,
) -> tuple[int, int, int, int, int, tuple[float, float], jax.Array]:
    """Checks the arguments of `ssd_state_update` (see its docstring for the rules).

    Returns:
      `(S, H, P, N, G, (lo, hi), idx)`: the cache's slots, heads, head dim and state size, the
      groups, the `dt` clamp, and the int32 `[Bt]` slot of each row.
    """
    S, H, P, N = check_rank("state", state, 4, "[S, H, P, N] (slots, heads, head_dim, d_state)")
    _check_dtype("state", state)
    Bt = check_rank("x", x, 3, "[Bt, H, P]")[0]
    _check_dtype("x", x)
    check_nonempty("x", Bt, "rows Bt")
    check_nonempty("state", S * H * P * N, "size")
    _check_shape("x", x, (Bt, H, P), "[Bt, H, P] matching state's H, P")
    _check_shape("dt", dt, (Bt, H), "[Bt, H]")
    _check_shape("A", A, (H,), "[H]")
    G = check_rank("B", B, 3, "[Bt, G, N]")[1]
    _check_shape("B", B, (Bt, G, N), "[Bt, G, N] matching x's Bt and state's N")
    if G < 1 or H % G:
        raise ValueError(f"B has G={G} groups; H={H} must be a multiple of G (H % G == 0)")
    _check_shape("C", C, (Bt, G, N), "[Bt, G, N] like B")
    if D is not None:
        shape = getattr(D, "shape", None)
        want = (H,) if shape is not None and len(shape) == 1 else (H, P)
        _check_shape("D", D, want, "[H] or [H, P]")
    _check_shape("z", z, (Bt, H, P), "[Bt, H, P] like x")
    _check_shape("dt_bias", dt_bias, (H,), "[H]")
    if not isinstance(dt_softplus, bool):
        raise ValueError(f"dt_softplus={dt_softplus!r} must be a bool")
    lo, hi = _check_limit(dt_limit)
    check_finite("A", A, "the decay exp(dt' A) would be NaN or infinite for its head")
    if state_indices is None:
        if Bt > S:
            raise ValueError(
                f"x has Bt={Bt} rows but the cache has S={S} slots; without state_indices row "
                f"b updates slot b, so Bt <= S (or pass state_indices)"
            )
        idx = jnp.arange(Bt, dtype=jnp.int32)
    else:
        state_indices = _as_indices(state_indices)
        _check_indices(state_indices, Bt, S)
        idx = jnp.asarray(state_indices).astype(jnp.int32)
    return S, H, P, N, G, (lo, hi), idx
