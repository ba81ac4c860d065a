"""Integer and byte helpers shared by every stage: rounding, powers of two, size items and
human-readable byte counts. A leaf: imports only `jaxarena._errors`.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from jaxarena._errors import ArenaError

__all__ = [
    "ceil_div",
    "round_up",
    "ceil16",
    "is_pow2",
    "is_int",
    "size_items",
    "format_bytes",
]


def ceil_div(a: int, b: int) -> int:
    """Smallest integer >= a / b (a >= 0, b > 0)."""
    return -(-a // b)


def round_up(x: int, a: int) -> int:
    """`x` rounded up to a multiple of `a`."""
    return ceil_div(x, a) * a


def ceil16(x: int) -> int:
    """`x` rounded up to a multiple of 16: the row padding of the cuBLASLt FP8 arms."""
    return round_up(x, 16)


def is_pow2(x: Any) -> bool:
    """True for a positive Python int that is a power of two."""
    return isinstance(x, int) and x > 0 and (x & (x - 1)) == 0


def is_int(x: Any) -> bool:
    """True for an integral number that is not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def size_items(sizes: Any) -> list[tuple[str, int]]:
    """`(name, nbytes)` pairs of a `BufferSizes` (anything with `as_dict`) or a mapping.

    Raises:
      ArenaError: `sizes` is neither, or a name is not a non-empty str, or a size is not an
        int >= 0 (every bad entry listed).
    """
    if hasattr(sizes, "as_dict"):
        sizes = sizes.as_dict()
    if not isinstance(sizes, Mapping):
        raise ArenaError(
            f"sizes must be a BufferSizes or a {{name: nbytes}} mapping, got {type(sizes).__name__}"
        )
    items = []
    bad = []
    for name, nbytes in sizes.items():
        if not isinstance(name, str) or not name:
            bad.append(f"name {name!r} must be a non-empty str")
        elif isinstance(nbytes, bool) or not isinstance(nbytes, int | np.integer) or nbytes < 0:
            bad.append(f"{name}={nbytes!r} must be an int >= 0")
        else:
            items.append((name, int(nbytes)))
    if bad:
        raise ArenaError("invalid sizes:\n  - " + "\n  - ".join(bad))
    return items


def format_bytes(n: int) -> str:
    """`n` bytes in binary units: `'3.58 GiB'`, `'256 B'`."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
