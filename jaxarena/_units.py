"""Integer and byte helpers shared by every stage: rounding, powers of two, size items,
the arena's row size, human-readable byte counts and memory strings (`parse_memory`). A leaf: imports only
`jaxarena._errors`.
"""

from __future__ import annotations

import math
import numbers
import operator
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from jaxarena._errors import ArenaError

__all__ = [
    "ROW_BYTES",
    "ceil_div",
    "round_up",
    "ceil16",
    "is_pow2",
    "is_int",
    "as_index",
    "plural",
    "size_items",
    "format_bytes",
    "parse_memory",
]

# Bytes per row of the arena array (`uint8[rows, ROW_BYTES]`, see `jaxarena._arena.bytes`).
# Regions need not start on a row (any power-of-two alignment works); aligned regions take the
# fast paths, which never flatten a region to 1-D.
ROW_BYTES = 256


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
    """True for a positive Python int (not a bool) that is a power of two."""
    return isinstance(x, int) and not isinstance(x, bool) and x > 0 and (x & (x - 1)) == 0


def is_int(x: Any) -> bool:
    """True for an integral number that is not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def as_index(value: Any) -> Any:
    """`value` as a Python int when it is an integer of any type (`int`, `np.int64`, ...: what
    `operator.index` accepts), else `value` unchanged, bools included, so the caller's own
    check names it. Every int argument of the plan API passes through this once, so its
    validators see one type."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        return value
    return operator.index(value)


def plural(count: int, noun: str, plural_form: str | None = None) -> str:
    """`'1 sequence'`, `'2 sequences'`, `'1,568 tokens'`: the count with thousands separators
    and the noun in the number it needs (`plural_form` for irregular nouns)."""
    return f"{count:,} {noun if count == 1 else plural_form or noun + 's'}"


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


# -- memory strings ------------------------------------------------------------------------------

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4, "p": 1000**5, "pb": 1000**5, "e": 1000**6, "eb": 1000**6,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5, "eib": 1024**6,
    "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4, "pi": 1024**5, "ei": 1024**6,
}  # fmt: skip
# A number with at most 30 significant characters: anything longer is a typo, not a size
# (10**30 bytes is a million times the largest machine's memory).
_NUMBER = re.compile(
    r"\s*([0-9]{1,30}(?:\.[0-9]{1,30})?(?:[eE][+]?[0-9]{1,2})?)\s*([A-Za-z]{0,3})\s*"
)
# No device or machine has an exabyte of memory: a larger size is a typo.
MAX_MEMORY = 1000**6


def parse_memory(text: Any) -> int:
    """A memory size in bytes: `"141GB"` (10^9), `"24GiB"` (2^30), `"80e9"`, `"1.5 TiB"`, or a
    plain byte count (`"1000000"`, or an int).

    Units (case-insensitive): B, K/KB, M/MB, G/GB, T/TB, P/PB, E/EB (powers of 1000) and
    KiB/MiB/GiB/TiB/PiB/EiB (powers of 1024). Fractions round down to whole bytes.

    Raises:
      ValueError: not a size (names the text and shows valid spellings), zero or negative, or
        above 1 EB (10^18 bytes; certainly a typo).
    """
    if isinstance(text, bool):
        raise ValueError(f"memory={text!r} is not a size; write e.g. 141GB, 24GiB or 80e9")
    if isinstance(text, int):
        value = text
        shown = str(text) if abs(text) < 10**40 else f"<int of {len(str(abs(text)))} digits>"
    elif isinstance(text, str):
        shown = text if len(text) <= 40 else text[:37] + "..."
        match = _NUMBER.fullmatch(text)
        if match is None or match.group(2).lower() not in _UNITS:
            if re.fullmatch(r"\s*-.*", text):
                raise ValueError(f"memory {shown!r} must be positive")
            raise ValueError(
                f"memory {shown!r} is not a size; write e.g. 141GB, 24GiB, 512MiB, 80e9 or a "
                f"byte count (at most 30 digits)"
            )
        number, unit = match.group(1), _UNITS[match.group(2).lower()]
        if re.fullmatch(r"[0-9]+", number):
            value = int(number) * unit
        else:
            value = math.floor(Fraction(number) * unit)
    else:
        raise ValueError(
            f"memory must be a str such as '141GB' or an int byte count, got {type(text).__name__}"
        )
    if value <= 0:
        raise ValueError(f"memory {shown!r} must be positive (at least one byte)")
    if value > MAX_MEMORY:
        raise ValueError(f"memory {shown!r} is over 1 EB (10^18 bytes); that is not a device")
    return value
