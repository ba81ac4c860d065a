"""How the arena kernels get the arena: whole on a GPU, as row windows in interpret mode.

The arena kernels (split-K attention, FP8 quantization) take the `uint8[rows, 256]` arena
as `uint32[rows, 64]` words, aliased to their output (`memory_space=pl.ANY`), and store each
value at its (row, word) position.

  - Compiled (GPU): the WHOLE arena is the operand. The word view and its inverse are XLA
    bitcasts and the alias makes the call in place: no temporary.
  - Interpreted (CPU): a bitcast to a different element width is a real copy on CPU, and
    the Pallas interpreter carries an aliased operand twice through its grid loop (as input
    and as output), so a whole-arena operand copies the arena. There the kernels get only
    the rows their regions occupy: each region's row span is sliced out (as bytes, then
    viewed as words), spans that share or touch a row are merged into one window (two
    windows holding the same row would write one back over the other), and after the call
    each window is written back with `dynamic_update_slice` (in place on a donated arena).
    The kernels address a window as they address the arena, with region rows relative to
    the window's first row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import lax

from jaxarena._units import ROW_BYTES

__all__ = [
    "ROW_BYTES",
    "WORD",
    "WORDS_PER_ROW",
    "Place",
    "Windows",
    "plan_windows",
    "to_bytes",
    "words",
]

# ROW_BYTES: the arena's row width, from the one place that defines it (re-exported here for
# the kernels that address the arena in rows).
WORD = 4
WORDS_PER_ROW = ROW_BYTES // WORD


def words(x: jax.Array) -> jax.Array:
    """uint8 `[rows, 256]` -> uint32 `[rows, 64]` (an XLA bitcast on the GPU)."""
    return lax.bitcast_convert_type(x.reshape(x.shape[0], WORDS_PER_ROW, WORD), jnp.uint32)


def to_bytes(w: jax.Array, shape: tuple[int, ...] | None = None) -> jax.Array:
    """uint32 `[rows, 64]` -> uint8 `[rows, 256]` (or `shape`); an XLA bitcast on the GPU."""
    out = lax.bitcast_convert_type(w, jnp.uint8)
    return out.reshape((w.shape[0], ROW_BYTES) if shape is None else shape)


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a region of 32-bit words starts in a 2-D word operand of row width `width` (the
    split-K and prefill attention kernels store their outputs and partials as words).

    Word `i` of the region is element `(row0 + (col0 + i) // width, (col0 + i) % width)`.
    `row0` is a static int (< 2^31); `i` is int32 (regions stay below 2^31 bytes).
    """

    row0: int
    col0: int
    width: int

    def at(self, i):
        j = self.col0 + i
        return self.row0 + j // self.width, j % self.width


@dataclasses.dataclass(frozen=True)
class Windows:
    """The arena operands of a call: `spans[i] = (first row, end row)` of window `i` (the whole
    arena when `whole`), and for each region the window holding it (`None`: the region is
    empty and has no window; it is addressed in window 0)."""

    spans: tuple[tuple[int, int], ...]
    index: tuple[int | None, ...]
    whole: bool

    def row0(self, region: int, offset_bytes: int) -> int:
        """The first row of `region` (at `offset_bytes` in the arena) in its window."""
        i = self.index[region]
        return offset_bytes // ROW_BYTES - (0 if i is None else self.spans[i][0])

    def window_of(self, region: int) -> int:
        """The window holding `region` (0 for an empty region)."""
        i = self.index[region]
        return 0 if i is None else i

    def rows(self, window: int) -> int:
        """Rows in `window`."""
        lo, hi = self.spans[window]
        return hi - lo

    def joined_row0(self, region: int, offset_bytes: int) -> int:
        """The first row of `region` in the joined operand (`take_joined`)."""
        i = self.window_of(region)
        return self.row0(region, offset_bytes) + sum(self.rows(j) for j in range(i))

    def take_joined(self, arena: jax.Array) -> jax.Array:
        """All windows as ONE uint32 operand, stacked in window order (the whole arena when
        `whole`). One operand, not one per window: XLA copies the arena when a kernel gets
        several windows and each is written back on its own."""
        parts = self.take(arena)
        return parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=0)

    def put_joined(self, arena: jax.Array, joined: jax.Array) -> jax.Array:
        """The arena with `take_joined`'s operand written back, window by window."""
        if len(self.spans) == 1:
            return self.put(arena, [joined])
        bounds = [sum(self.rows(j) for j in range(i + 1)) for i in range(len(self.spans))]
        parts = jnp.split(joined, bounds[:-1], axis=0)
        return self.put(arena, parts)

    def take(self, arena: jax.Array, window: int | None = None) -> list[jax.Array] | jax.Array:
        """The windows as uint32 words (one window with `window`). A window is sliced as bytes
        first: on CPU a bitcast of the whole arena is a copy."""
        if window is not None:
            lo, hi = self.spans[window]
            if self.whole:
                return words(arena)
            return words(lax.slice(arena, (lo, 0), (hi, ROW_BYTES)))
        return [self.take(arena, i) for i in range(len(self.spans))]  # type: ignore[misc]

    def put(self, arena: jax.Array, results: Sequence[jax.Array],
            window: int | None = None) -> jax.Array:  # fmt: skip
        """The arena with the windows' words written back (`results` in window order, or the
        one `window`)."""
        which = range(len(self.spans)) if window is None else [window]
        for i, w in zip(which, results, strict=True):
            if self.whole:
                arena = to_bytes(w, arena.shape)
            else:
                arena = lax.dynamic_update_slice(arena, to_bytes(w), (self.spans[i][0], 0))
        return arena


def plan_windows(arena_rows: int, extents: Sequence[tuple[int, int]], *,
                 whole: bool) -> Windows:  # fmt: skip
    """The arena operands for regions at `extents = [(offset bytes, bytes written), ...]`.

    `whole=True` (compiled kernels): one window, the whole arena. Otherwise one window per
    group of regions whose row spans share or touch a row, in arena order.
    """
    if whole:
        return Windows(((0, arena_rows),), tuple(0 for _ in extents), True)
    spans = [
        (off // ROW_BYTES, -(-(off + n) // ROW_BYTES)) if n > 0 else None for off, n in extents
    ]
    merged: list[list[int]] = []
    for lo, hi in sorted(s for s in spans if s is not None):
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    index = tuple(
        None if s is None else next(i for i, m in enumerate(merged) if m[0] <= s[0] < m[1])
        for s in spans
    )
    return Windows(tuple((lo, hi) for lo, hi in merged), index, False)
