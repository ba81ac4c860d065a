"""The lifetime-aware packer behind `ArenaPlan.packed` (sizes + lifetimes -> offsets) and the
check of a layout against lifetimes. It never sees `ArenaPlan`.

The packer is the offline greedy best-fit used by memory planners (TFLite's arena planner,
XLA's heap simulator with a global decreasing-size order): buffers are placed one at a time;
each goes into the tightest gap (the leading gap at offset 0 included) left between the
already-placed buffers it conflicts with, or on top of them when no gap fits. It runs
several placement orders (by size, lifetime length, start, size x length, crowding, peak
members first) with best-fit and first-fit, keeps the smallest layout, and stops as soon as a
layout reaches the lower bound (the peak of live bytes, `Lifetimes.peak`), which no layout can
beat.

Guard bands: with `guard_bytes > 0` a region occupies `nbytes + guard_bytes`. Besides never
overlapping a conflicting buffer, no region's bytes may cover another region's guard band
(even a non-conflicting one's) and two guard bands are disjoint or identical, so `allocate`
and `check_guards` keep working on a packed arena: a legitimate write to a shared byte never
reads as an overrun. Two non-conflicting guarded regions can therefore share bytes only when
they end at the same byte (their guard bands then coincide): packing saves much less with
guards, which are a debugging aid.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

from jaxarena._arena.lifetimes import Interval, Lifetimes, first_common
from jaxarena._errors import ArenaError
from jaxarena._units import ROW_BYTES, as_index, is_pow2
from jaxarena._units import round_up as _round_up
from jaxarena._units import size_items as _size_items

__all__ = ["pack", "packed_layout", "plan_violations"]

_INF = math.inf
# Local search: placements tried after the greedy orders, and how many of the highest buffers
# each round tries to move. Counted, not timed, so that a plan never depends on machine speed.
_SEARCH_BUDGET = 400
_SEARCH_TOPS = 4


class _Buf:
    """One buffer being placed: its bytes, its footprint and its live intervals."""

    __slots__ = ("name", "nbytes", "span", "intervals", "by_mode", "length", "start", "index")

    def __init__(self, index: int, name: str, nbytes: int, guard: int, lt: Lifetimes) -> None:
        self.index = index
        self.name = name
        self.nbytes = nbytes
        self.span = nbytes + guard  # bytes it occupies from its offset, guard band included
        self.intervals = lt.intervals(name)
        self.by_mode: dict[str, tuple[list[int], list[int]]] = {}
        for iv in self.intervals:
            starts, ends = self.by_mode.setdefault(iv.mode, ([], []))
            starts.append(iv.start)
            ends.append(iv.end)
        steps = lt.num_steps
        # Share of each mode's steps it is live in, summed over modes (modes of different
        # step counts weigh the same), and its earliest relative start.
        self.length = sum((iv.end - iv.start) / steps[iv.mode] for iv in self.intervals)
        self.start = min((iv.start / steps[iv.mode] for iv in self.intervals), default=1.0)


def pack(
    sizes: Any, lifetimes: Lifetimes, *, align_bytes: int = 256, guard_bytes: int = 0
) -> tuple[dict[str, int], int]:
    """Offsets for the non-empty buffers of `sizes` so that conflicting buffers never share a byte.

    Returns:
      `(offsets, end_bytes)`: `{name: offset_bytes}` (multiples of `align_bytes`) and the end
      of the highest region (guard band included).
    """
    bufs, conflict = _prepare(sizes, lifetimes, align_bytes, guard_bytes)
    if not bufs:
        return {}, 0
    lower = lifetimes.lower_bound_bytes(sizes, align_bytes=align_bytes, guard_bytes=guard_bytes)
    unit = max(align_bytes, ROW_BYTES)
    best: tuple[int, dict[str, int]] | None = None
    for _, order in _orders(bufs, conflict, lifetimes, sizes, align_bytes, guard_bytes):
        for fit in ("best", "first"):
            offsets = _place(order, conflict, align_bytes, guard_bytes, fit)
            end = max(offsets[b.index] + b.span for b in bufs)
            if best is None or end < best[0]:
                best = (end, {b.name: offsets[b.index] for b in bufs})
                best_order, best_fit = order, fit
            if _round_up(best[0], unit) <= _round_up(lower, unit):
                return best[1], best[0]
    assert best is not None
    # Local search from the winning order: move one of the buffers that end highest to an
    # earlier place in the order. A fixed number of tries keeps the result deterministic.
    order = best_order
    budget = _SEARCH_BUDGET
    improved = True
    while improved and budget > 0 and _round_up(best[0], unit) > _round_up(lower, unit):
        improved = False
        offsets = _place(order, conflict, align_bytes, guard_bytes, best_fit)
        tops = sorted(order, key=lambda b: (-(offsets[b.index] + b.span), b.index))[:_SEARCH_TOPS]
        for b in tops:
            i = order.index(b)
            for pos in range(i):
                trial = order[:pos] + [b] + order[pos:i] + order[i + 1 :]
                offsets = _place(trial, conflict, align_bytes, guard_bytes, best_fit)
                end = max(offsets[c.index] + c.span for c in bufs)
                budget -= 1
                if end < best[0]:
                    best = (end, {c.name: offsets[c.index] for c in bufs})
                    order, improved = trial, True
                    break
                if budget <= 0:
                    break
            if improved or budget <= 0:
                break
    return best[1], best[0]


def packed_layout(
    sizes: Any, lifetimes: Lifetimes, *, align_bytes: int = 256, guard_bytes: int = 0
) -> tuple[list[tuple[str, int, int]], int, frozenset[frozenset[str]]]:
    """`ArenaPlan.packed`'s layout as plain data.

    Returns:
      `([(name, offset_bytes, nbytes), ...] in the order of sizes (zero sizes left out),
      total_bytes, may_alias)`: total rounded up to `max(align_bytes, ROW_BYTES)` (so it is
      never below the lower bound, like `sequential`), may_alias every non-conflicting pair.

    Raises:
      ArenaError: `lifetimes` is not a `Lifetimes`, `align_bytes` not a power of two, or
        `guard_bytes` not an int >= 0.
    """
    if not isinstance(lifetimes, Lifetimes):
        raise ArenaError(
            "lifetimes must be a Lifetimes (Lifetimes.standard(config), "
            f"record_lifetimes(...)), got {type(lifetimes).__name__}"
        )
    align_bytes, guard_bytes = as_index(align_bytes), as_index(guard_bytes)
    if not is_pow2(align_bytes):
        raise ArenaError(f"align_bytes={align_bytes!r} must be a power of two")
    if isinstance(guard_bytes, bool) or not isinstance(guard_bytes, int) or guard_bytes < 0:
        raise ArenaError(f"guard_bytes={guard_bytes!r} must be an int >= 0")
    items = [(n, b) for n, b in _size_items(sizes) if b]
    offsets, end = pack(sizes, lifetimes, align_bytes=align_bytes, guard_bytes=guard_bytes)
    layout = [(n, offsets[n], b) for n, b in items]
    total = _round_up(end, max(align_bytes, ROW_BYTES)) if layout else ROW_BYTES
    names = [n for n, _ in items]
    may_alias = frozenset(
        frozenset((a, b))
        for i, a in enumerate(names)
        for b in names[i + 1 :]
        if not lifetimes.conflicts(a, b)
    )
    return layout, total, may_alias


def plan_violations(regions: Any, guard_bytes: int, lifetimes: Lifetimes) -> list[str]:
    """Every way a layout breaks `lifetimes`: conflicting regions that share bytes, and (with
    guard bands) regions whose bytes cover another region's guard band.

    Args:
      regions: objects with `name`, `offset_bytes` and `end_bytes` (a plan's regions).
      guard_bytes: the guard band after every region.
      lifetimes: the lifetimes to check against.
    """
    problems: list[str] = []
    g = guard_bytes
    regions = sorted(regions, key=lambda r: r.offset_bytes)
    for i, a in enumerate(regions):
        for b in regions[i + 1 :]:
            if b.offset_bytes >= a.end_bytes + g:
                break
            common = lifetimes.common_step(a.name, b.name)
            lo, hi = b.offset_bytes, min(a.end_bytes + g, b.end_bytes + g)
            if common is not None:
                problems.append(
                    f"{a.name!r} [{a.offset_bytes}, {a.end_bytes}) and {b.name!r} "
                    f"[{b.offset_bytes}, {b.end_bytes}) share bytes [{lo}, {hi}) but are both "
                    f"live in {common.mode} steps [{common.start}, {common.end})"
                    + _label(lifetimes, common)
                )
            elif g:
                # Not live together, so they may share bytes, but a guard band must stay
                # untouched by every other region, and two guard bands must be disjoint or
                # identical (allocate writes each one; identical bands hold the same pattern).
                for x, y in ((a, b), (b, a)):
                    if x.offset_bytes < y.end_bytes + g and y.end_bytes < x.end_bytes:
                        problems.append(
                            f"{x.name!r} [{x.offset_bytes}, {x.end_bytes}) covers the guard band "
                            f"[{y.end_bytes}, {y.end_bytes + g}) of {y.name!r}"
                        )
                if a.end_bytes != b.end_bytes and abs(a.end_bytes - b.end_bytes) < g:
                    problems.append(
                        f"the guard bands of {a.name!r} [{a.end_bytes}, {a.end_bytes + g}) and "
                        f"{b.name!r} [{b.end_bytes}, {b.end_bytes + g}) overlap"
                    )
    return problems


# -- placement ---------------------------------------------------------------------------------


def _prepare(
    sizes: Any, lt: Lifetimes, align: int, guard: int
) -> tuple[list[_Buf], list[list[bool]]]:
    bufs = [
        _Buf(i, n, b, guard, lt)
        for i, (n, b) in enumerate((n, b) for n, b in _size_items(sizes) if b)
    ]
    n = len(bufs)
    conflict = [[False] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if first_common(bufs[i].intervals, bufs[j].intervals) is not None:
                conflict[i][j] = conflict[j][i] = True
    return bufs, conflict


def _orders(
    bufs: list[_Buf],
    conflict: list[list[bool]],
    lt: Lifetimes,
    sizes: Any,
    align: int,
    guard: int,
) -> list[tuple[str, list[_Buf]]]:
    crowd = {b.index: sum(c.span for c in bufs if conflict[b.index][c.index]) for b in bufs}
    peak = set(lt.peak(sizes, align_bytes=align, guard_bytes=guard).names)
    # Greedy by breadth (TFLite): walk the steps from the most crowded down, taking the buffers
    # live there not taken yet, largest first.
    breadth: list[_Buf] = []
    taken: set[int] = set()
    for _, mode, step in _steps_by_breadth(bufs):
        if len(taken) == len(bufs):
            break
        live = [b for b in bufs if b.index not in taken and _live_at(b, mode, step)]
        for b in sorted(live, key=lambda b: (-b.span, b.index)):
            breadth.append(b)
            taken.add(b.index)
    breadth.extend(sorted((b for b in bufs if b.index not in taken), key=lambda b: -b.span))
    keys: list[tuple[str, Callable[[_Buf], tuple]]] = [
        ("peak-first", lambda b: (b.name not in peak, -b.span, -b.length, b.index)),
        ("size", lambda b: (-b.span, -b.length, b.index)),
        ("size*length", lambda b: (-b.span * b.length, -b.span, b.index)),
        ("length", lambda b: (-b.length, -b.span, b.index)),
        ("crowding", lambda b: (-crowd[b.index], -b.span, b.index)),
        ("start", lambda b: (b.start, -b.span, b.index)),
    ]
    return [("breadth", breadth)] + [(name, sorted(bufs, key=key)) for name, key in keys]


def _live_at(b: _Buf, mode: str, step: int) -> bool:
    starts, ends = b.by_mode.get(mode, ((), ()))
    i = bisect.bisect_right(starts, step) - 1
    return i >= 0 and step < ends[i]


def _steps_by_breadth(bufs: list[_Buf]) -> list[tuple[int, str, int]]:
    """`(live bytes, mode, step)` at every step where some interval starts, most bytes first."""
    deltas: dict[str, list[tuple[int, int]]] = {}
    for b in bufs:
        for iv in b.intervals:
            deltas.setdefault(iv.mode, []).extend(((iv.start, b.span), (iv.end, -b.span)))
    rows = []
    for mode, events in deltas.items():
        events.sort()
        live, i = 0, 0
        while i < len(events):
            step, starts = events[i][0], False
            while i < len(events) and events[i][0] == step:
                live += events[i][1]
                starts = starts or events[i][1] > 0
                i += 1
            if starts:
                rows.append((live, mode, step))
    return sorted(rows, key=lambda r: (-r[0], r[1], r[2]))


def _place(
    order: list[_Buf], conflict: list[list[bool]], align: int, guard: int, fit: str
) -> dict[int, int]:
    """Offsets (by buffer index) for `order`, placed one at a time."""
    placed: list[tuple[_Buf, int]] = []
    offsets: dict[int, int] = {}
    for b in order:
        # Offsets `o` that are forbidden: lo < o < hi for each (lo, hi).
        forbidden: list[tuple[int, int]] = []
        for p, po in placed:
            if conflict[b.index][p.index]:
                forbidden.append((po - b.span, po + p.span))
            elif guard:
                # May share bytes, but b's bytes must not cover p's guard band, b's guard band
                # must not cover p's bytes, and two guard bands are disjoint or identical. All
                # three hold outside (po - b.nbytes - guard, p_end + guard), and at the one
                # offset inside that makes b end where p ends.
                p_end = po + p.nbytes
                forbidden.append((po - b.nbytes - guard, p_end - b.nbytes))
                forbidden.append((p_end - b.nbytes, p_end + guard))
        o = _best_offset(forbidden, align, fit)
        offsets[b.index] = o
        placed.append((b, o))
    return offsets


def _best_offset(forbidden: list[tuple[int, int]], align: int, fit: str) -> int:
    """The aligned offset >= 0 outside every open interval of `forbidden`: in the tightest
    bounded gap (`fit="best"`, ties to the lowest) or the lowest one (`fit="first"`)."""
    # Closed integer ranges of forbidden offsets, merged.
    closed = sorted((lo + 1, hi - 1) for lo, hi in forbidden if lo + 1 <= hi - 1)
    gaps: list[tuple[int, float]] = []
    cursor = 0  # lowest offset not yet known to be forbidden
    for lo, hi in closed:
        if lo > cursor:
            gaps.append((cursor, lo - 1))
        cursor = max(cursor, hi + 1)
    gaps.append((cursor, _INF))
    best: tuple[float, int] | None = None
    for g0, g1 in gaps:
        o = _round_up(g0, align)
        if o > g1:
            continue
        if fit == "first":
            return o
        slack = g1 - o  # how far the buffer could still slide: the gap's unused bytes
        if best is None or (slack, o) < best:
            best = (slack, o)
    assert best is not None  # the last gap is unbounded
    return best[1]


def _label(lt: Lifetimes, iv: Interval) -> str:
    first = lt.label(iv.mode, iv.start)
    return f" (from {first!r})" if first else ""
