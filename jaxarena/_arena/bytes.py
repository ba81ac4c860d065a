"""Byte plumbing of the arena: the row width, static shapes and dtypes of views, and the
static-offset slice / bitcast / `dynamic_update_slice` that read and write a region's bytes.

The arena is ONE `uint8` `jax.Array` of shape `(rows, ROW_BYTES)`. It is 2-D on purpose: on
CPU, a jitted `lax.dynamic_update_slice` into a 1-D `uint8` array of more than 2^31 elements
crashes the process, and a 2-D array of the same bytes works; with 256-byte rows every row
index stays below 2^31 for arenas up to 512 GiB, so no offset needs `jax_enable_x64`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxarena._errors import ArenaError
from jaxarena._units import ROW_BYTES

__all__ = [
    "ROW_BYTES",
    "static_shape",
    "view_dtype",
    "to_bytes",
    "from_bytes",
    "load_bytes",
    "store_bytes",
]


def static_shape(shape: Any, what: str) -> tuple[int, ...]:
    if isinstance(shape, int | np.integer):
        shape = (shape,)
    try:
        dims = tuple(shape)
    except TypeError:
        raise ArenaError(f"{what}: shape={shape!r} must be a tuple of ints") from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int | np.integer):
            raise ArenaError(
                f"{what}: shape={shape!r} must be static ints (got {type(d).__name__}); views "
                "have static offsets and sizes"
            )
        if d < 0:
            raise ArenaError(f"{what}: shape={shape!r} has a negative dimension")
    return tuple(int(d) for d in dims)


def view_dtype(dtype: Any, what: str) -> np.dtype:
    try:
        dt = jnp.dtype(dtype)
    except (TypeError, ValueError):  # numpy raises ValueError for some non-dtypes (a dict)
        raise ArenaError(f"{what}: dtype={dtype!r} is not a JAX dtype") from None
    if dt.itemsize == 0 or dt.name in ("int4", "uint4", "int2", "uint2", "float4_e2m1fn"):
        raise NotImplementedError(f"{what}: sub-byte dtype {dt.name} views are not supported")
    if dt.kind == "c":
        raise NotImplementedError(f"{what}: complex dtype {dt.name} views are not supported")
    if dt.itemsize > 4 and not jax.config.jax_enable_x64:
        # Without x64 JAX narrows every 64-bit array to 32 bits, so a view would fail deep
        # inside the bitcast ("8 * 8 != 32") and a write would store narrowed bytes.
        shown = "dtype=None (float64)" if dtype is None else f"dtype {dt.name}"
        raise ArenaError(
            f"{what}: {shown} is 64-bit but jax_enable_x64 is off; use a 32-bit dtype or "
            "jax.config.update('jax_enable_x64', True)"
        )
    return dt


def to_bytes(value: jax.Array) -> jax.Array:
    """`value` as uint8, shape `value.shape + (itemsize,)` (or `value.shape` for 1-byte)."""
    if value.dtype == jnp.bool_:
        value = value.astype(jnp.uint8)
    if value.dtype == jnp.uint8:
        return value
    return lax.bitcast_convert_type(value, jnp.uint8)


def from_bytes(raw: jax.Array, shape: tuple[int, ...], dtype: np.dtype) -> jax.Array:
    """Inverse of `to_bytes` for bytes of any shape holding exactly `prod(shape)` items."""
    if dtype == jnp.bool_:
        return raw.reshape(shape) != 0
    if dtype.itemsize == 1:
        out = raw if dtype == jnp.uint8 else lax.bitcast_convert_type(raw, dtype)
        return out.reshape(shape)
    if raw.ndim == 2 and raw.shape[1] % dtype.itemsize == 0:
        # Row-aligned region: group bytes within rows, never flattening the region to 1-D.
        grouped = raw.reshape(raw.shape[0], raw.shape[1] // dtype.itemsize, dtype.itemsize)
    else:
        grouped = raw.reshape(-1, dtype.itemsize)
    return lax.bitcast_convert_type(grouped, dtype).reshape(shape)


def load_bytes(arena: jax.Array, offset: int, nbytes: int) -> jax.Array:
    """`nbytes` bytes from byte `offset`: `(rows, ROW_BYTES)` when row-aligned, else 1-D."""
    r0, lo = divmod(offset, ROW_BYTES)
    r1 = -(-(offset + nbytes) // ROW_BYTES)
    block = lax.slice(arena, (r0, 0), (r1, ROW_BYTES))
    if lo == 0 and nbytes % ROW_BYTES == 0:
        return block
    return lax.slice(block.reshape(-1), (lo,), (lo + nbytes,))


def store_bytes(arena: jax.Array, offset: int, raw: jax.Array) -> jax.Array:
    """Stores `raw` (uint8, any shape) at byte `offset`, leaving every other byte alone.

    Whole rows go in with one `dynamic_update_slice`; a partial first or last row gets a
    `(1, k)` update of its own. The arena is never read here: a read-modify-write of the
    partial rows would give XLA a read of the old arena next to the in-place update, which it
    resolves by copying the whole arena.
    """
    n = raw.size
    r, lo = divmod(offset, ROW_BYTES)
    zero = jnp.int32(0)
    if lo == 0 and n % ROW_BYTES == 0:
        return lax.dynamic_update_slice(arena, raw.reshape(n // ROW_BYTES, ROW_BYTES),
                                        (jnp.int32(r), zero))  # fmt: skip
    flat = raw.reshape(-1)
    pos = 0
    if lo:
        k = min(ROW_BYTES - lo, n)
        arena = lax.dynamic_update_slice(
            arena, flat[:k].reshape(1, k), (jnp.int32(r), jnp.int32(lo))
        )
        pos, r = k, r + 1
    full = (n - pos) // ROW_BYTES
    if full:
        body = flat[pos : pos + full * ROW_BYTES].reshape(full, ROW_BYTES)
        arena = lax.dynamic_update_slice(arena, body, (jnp.int32(r), zero))
        pos, r = pos + full * ROW_BYTES, r + full
    if pos < n:
        arena = lax.dynamic_update_slice(
            arena, flat[pos:].reshape(1, n - pos), (jnp.int32(r), zero)
        )
    return arena
