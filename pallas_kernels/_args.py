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
    "resolve_interpret",
    "is_int",
    "is_concrete",
    "array_shape",
    "check_rank",
    "check_float",
]


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
