"""Argument checks shared by the three kernel wrappers, and the backend choice.

Every message names the argument, shows its value and states the rule, as the wrappers'
own checks do.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "check_kv_scale",
    "check_paged_heads",
    "paged_v_shape",
    "resolve_interpret",
    "is_int",
    "is_concrete",
    "array_shape",
    "check_rank",
    "check_float",
    "check_finite",
    "check_nonempty",
    "int_values",
]

# The largest value an int32 index or offset holds.
INT32_MAX = (1 << 31) - 1


def resolve_interpret(interpret: bool | None) -> bool:
    """`interpret=None` means interpret mode on a CPU backend and compiled on a GPU.

    Pallas has no compiled CPU backend, so a CPU run must interpret; on a GPU the kernel is
    compiled unless the caller asks for the interpreter explicitly (useful for debugging).
    """
    if interpret is None:
        return jax.default_backend() == "cpu"
    if not isinstance(interpret, bool):
        raise TypeError(f"interpret={interpret!r} must be None, True or False")
    return interpret


def is_int(v: Any) -> bool:
    """True for a Python or NumPy integer that is not a bool."""
    return isinstance(v, int | np.integer) and not isinstance(v, bool)


def is_concrete(v: Any) -> bool:
    """True unless `v` is a JAX tracer (a value known only at run time)."""
    return not isinstance(v, jax.core.Tracer)


def array_shape(name: str, v: Any) -> tuple[int, ...]:
    """`v.shape`; a `ValueError` naming `name` when `v` is not an array."""
    if not hasattr(v, "shape") or not hasattr(v, "dtype"):
        raise ValueError(f"{name} must be an array with .shape and .dtype, got {type(v)!r}")
    return tuple(v.shape)


def check_rank(name: str, v: Any, ndim: int, layout: str) -> tuple[int, ...]:
    """`v.shape` as ints after checking that `v` is an `ndim`-D array laid out as `layout`."""
    shape = getattr(v, "shape", None)
    if shape is None or getattr(v, "dtype", None) is None:
        raise ValueError(f"{name} must be an array with .shape and .dtype, got {type(v).__name__}")
    if len(shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got {name}.shape={tuple(shape)}")
    return tuple(int(d) for d in shape)


def check_float(name: str, v: Any) -> None:
    """A `ValueError` naming `name` unless `v` has a floating dtype."""
    if not jnp.issubdtype(v.dtype, jnp.floating):
        raise ValueError(f"{name}.dtype={v.dtype} must be a floating dtype")


def check_finite(name: str, v: Any, consequence: str) -> None:
    """A `ValueError` naming the first non-finite element of a CONCRETE float array `v`.

    A concrete array is read with NumPy, so it is checked also when the wrapper runs inside a
    caller's `jit` (e.g. a closed-over constant; a jnp op there would be staged out). Traced
    values (arguments of that `jit`) are not known here and are skipped; each kernel's
    docstring says what a non-finite traced value does (it propagates as NaN, never as a
    plausible number). `consequence` says why the value is refused (e.g. "every output of its
    head would be NaN").
    """
    if not is_concrete(v) or not jnp.issubdtype(jnp.dtype(v.dtype), jnp.floating):
        return
    # NumPy, not jnp: inside a jit trace a jnp op on a closed-over constant is a tracer.
    host = np.asarray(v).astype(np.float32)
    ok = np.isfinite(host)
    if ok.all():
        return
    index = tuple(int(i) for i in np.argwhere(~ok)[0])
    value = host[index]
    raise ValueError(
        f"{name}[{', '.join(map(str, index))}]={float(value)} is not finite ({int((~ok).sum())} "
        f"non-finite value(s) in {name}); {consequence}"
    )


def check_nonempty(name: str, size: int, what: str) -> None:
    """A `ValueError` when dimension `what` of `name` is 0: nothing to compute, and an empty
    Pallas grid fails deep inside the lowering instead of returning."""
    if size < 1:
        raise ValueError(
            f"{name} has {what} = {size}; it must be >= 1 (nothing to compute: skip the call)"
        )


def int_values(name: str, values: Any, *, lo: int = 0, hi: int = INT32_MAX) -> np.ndarray:
    """A Python list/tuple of ints as an `int32` array, every entry checked first.

    Refuses (with a `ValueError` naming the entry) what `np.asarray(values, np.int32)` would
    silently change or fail on: a float (10.7 would become 10), a bool, a non-number, and an int
    outside `[lo, hi]` (past int32 NumPy raises `OverflowError`).
    """
    for i, x in enumerate(values):
        if not is_int(x):
            raise ValueError(
                f"{name}[{i}]={x!r} must be an int, got {type(x).__name__} (a float is not "
                f"truncated: pass integer token offsets)"
            )
        if not lo <= x <= hi:
            raise ValueError(f"{name}[{i}]={x} is outside [{lo}, {hi}] (int32 token offsets)")
    return np.asarray(values, np.int32)


def paged_v_shape(kshape: tuple[int, ...], v_cache: Any, v_head_dim: Any) -> tuple[int, ...]:
    """The value cache's shape for the paged attention kernels: `v_cache`'s, or with
    `v_cache=None` (MLA's latent cache) `k_cache`'s with the first `v_head_dim` columns."""
    if v_cache is None:
        if not is_int(v_head_dim) or not 1 <= v_head_dim <= kshape[3]:
            raise ValueError(
                "v_cache=None reads the values from the first v_head_dim columns of k_cache "
                f"(MLA's latent cache): v_head_dim must be an int in 1..{kshape[3]} "
                f"(k_cache.shape[3]), got {v_head_dim=!r}"
            )
        return (*kshape[:3], int(v_head_dim))
    vshape = check_rank("v_cache", v_cache, 4, "[num_blocks, block_size, num_kv_heads, head_dim_v]")
    if v_head_dim is not None and v_head_dim != vshape[3]:
        raise ValueError(
            f"v_head_dim={v_head_dim!r} disagrees with v_cache.shape[3]={vshape[3]}; "
            "pass v_head_dim only with v_cache=None"
        )
    return vshape


def check_paged_heads(hq: int, d: int, kshape: tuple[int, ...], vshape: tuple[int, ...]) -> None:
    """The paged attention kernels' head checks: k and v caches share pages and heads, q and
    k share the head dim, and the q heads are a positive multiple of the kv heads."""
    if kshape[:3] != vshape[:3]:
        raise ValueError(
            f"k_cache and v_cache must share [num_blocks, block_size, num_kv_heads], got "
            f"k_cache.shape={kshape} and v_cache.shape={vshape}"
        )
    hkv, dk = kshape[2], kshape[3]
    if dk != d:
        raise ValueError(
            f"head dims differ: q.shape[-1]={d} but k_cache.shape[-1]={dk}; q and k_cache "
            "must share head_dim"
        )
    if hkv < 1 or hq < 1 or hq % hkv:
        raise ValueError(
            f"num_q_heads must be a positive multiple of num_kv_heads (GQA/MQA), got "
            f"q.shape[1]={hq} and k_cache.shape[2]={hkv}"
        )


def check_kv_scale(name: str, scale: Any, hkv: int) -> None:
    """k_scale / v_scale of a float8_e4m3fn KV cache (vLLM's dequantization scales, the real
    value being `scale * page`): a positive float, or a float array of shape (), (1,) (per
    tensor) or (Hkv,) (per KV head); its values are checked when concrete."""
    if scale is None:
        raise ValueError(
            f"{name} is required with a float8_e4m3fn KV cache (vLLM's per-tensor or "
            f"per-KV-head dequantization scale); pass a float or float32[{hkv}]"
        )
    if isinstance(scale, int | float | np.number) and not isinstance(scale, bool):
        vals = np.asarray([float(scale)])
    else:
        shape = getattr(scale, "shape", None)
        if shape is None or not jnp.issubdtype(getattr(scale, "dtype", np.int32), jnp.floating):
            raise ValueError(
                f"{name} must be a float or a floating array of shape (), (1,) or ({hkv},), "
                f"got {type(scale).__name__}"
            )
        if tuple(shape) not in ((), (1,), (hkv,)):
            raise ValueError(
                f"{name}.shape={tuple(shape)} must be (), (1,) (per tensor) or ({hkv},) "
                f"(per KV head, k_cache.shape[2]={hkv})"
            )
        if not is_concrete(scale):
            return  # values unknown under jit
        vals = np.asarray(scale, np.float32).reshape(-1)
    bad = ~np.isfinite(vals) | (vals <= 0.0)
    if bad.any():
        raise ValueError(
            f"{name} must be finite and > 0 (a scale of 0 would dequantize every page to 0), "
            f"got {name}={vals.tolist() if vals.size > 1 else float(vals[0])}"
        )
