"""`Lifetimes`: when each arena buffer is live, as half-open step intervals per mode.

A forward pass is a sequence of steps; a buffer is live over `[start, end)` when it holds a
value that a later step still reads. A pass runs in one of several *modes* (`prefill`,
`decode`, `verify`) that never run at the same time, so two buffers *conflict* (must not share
a byte) iff some mode has intersecting intervals for both, and the least memory any layout can
need is the peak, over modes and steps, of the bytes live at one step (`Lifetimes.peak`).

Two sources of lifetimes:

* `Lifetimes.standard(config)`: the standard layer schedule of the seed's runtime, a table
  kept as data in `jaxarena._arena.schedule` (which documents it). It is written from what
  each buffer is for, not from a trace, and it is conservative where the seed's use is not
  certain.
* `record_lifetimes(fn, *args, mode=...)`: intervals recorded from the `plan.view` and
  `plan.write` calls a step function makes when it is traced.

Rules shared by both:

* A buffer the lifetimes do not name is *unknown* and counts as live at every step of every
  mode (the conservative default): `ArenaPlan.packed` never lets it share a byte.
* A buffer the lifetimes do name is live exactly over its intervals; in a mode where it has
  none it is dead (that mode does not use it). So a recording must cover a whole pass of its
  mode; merge several recordings (`a | b`) to cover several modes.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from jaxarena._arena import schedule
from jaxarena._errors import ArenaError
from jaxarena._units import as_index
from jaxarena._units import is_int as _is_int
from jaxarena._units import is_pow2 as _is_pow2
from jaxarena._units import round_up as _round_up
from jaxarena._units import size_items as _size_items

__all__ = [
    "Interval",
    "Lifetimes",
    "Peak",
]


class Interval(NamedTuple):
    """Steps `[start, end)` of `mode` during which a buffer is live (`0 <= start < end`)."""

    mode: str
    start: int
    end: int


class Peak(NamedTuple):
    """The step with the most live bytes: `bytes` live at step `step` of `mode`, held by
    `names` (each counted rounded up to the alignment, guard band included)."""

    bytes: int
    mode: str
    step: int
    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True, init=False)
class Lifetimes:
    """When each buffer is live: half-open step intervals per mode. Frozen and hashable.

    Build one with `Lifetimes({name: [(mode, start, end), ...]}, num_steps={mode: n})`, with
    `Lifetimes.standard(config)` (the documented table of the seed's layer schedule), or with
    `record_lifetimes(step, ...)`. Combine recordings of different modes with `a | b`.

    A buffer named here is live exactly over its intervals (dead in a mode where it has none);
    a buffer not named here is *unknown* and live at every step of every mode. Overlapping and
    touching intervals are merged, so two `Lifetimes` with the same live steps compare equal.

    Args:
      live: `{buffer name: iterable of (mode, start, end)}`; `0 <= start < end <= num_steps`.
        An empty iterable means "never live" (the buffer may share bytes with anything).
      num_steps: `{mode: number of steps}`, each >= 1. Default: per mode, the largest `end`.
      step_labels: optional `{mode: one label per step}` (e.g. phase names), for reports.

    Raises:
      ArenaError: every malformed entry at once (bad names, modes, bounds, label counts).
    """

    live_items: tuple[tuple[str, tuple[Interval, ...]], ...]
    steps_items: tuple[tuple[str, int], ...]
    labels_items: tuple[tuple[str, tuple[str, ...]], ...] = dataclasses.field(
        compare=False, repr=False
    )

    def __init__(
        self,
        live: Mapping[str, Iterable[tuple[str, int, int]]],
        *,
        num_steps: Mapping[str, int] | None = None,
        step_labels: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        problems: list[str] = []
        if not isinstance(live, Mapping):
            raise ArenaError(
                f"live must be a mapping {{name: [(mode, start, end), ...]}}, got "
                f"{type(live).__name__}"
            )
        parsed: dict[str, list[tuple[str, int, int]]] = {}
        for name, intervals in live.items():
            if not isinstance(name, str) or not name:
                problems.append(f"buffer name {name!r} must be a non-empty str")
                continue
            try:
                items = list(intervals)
            except TypeError:
                problems.append(f"{name}: intervals={intervals!r} must be an iterable of tuples")
                continue
            good = []
            for item in items:
                if (
                    not isinstance(item, tuple | list)
                    or len(item) != 3
                    or not isinstance(item[0], str)
                    or not item[0]
                    or not _is_int(item[1])
                    or not _is_int(item[2])
                ):
                    problems.append(
                        f"{name}: interval {item!r} must be (mode: str, start: int, end: int)"
                    )
                elif not 0 <= item[1] < item[2]:
                    problems.append(
                        f"{name}: interval {tuple(item)!r} needs 0 <= start < end (half-open)"
                    )
                else:
                    good.append((item[0], int(item[1]), int(item[2])))
            parsed[name] = good

        steps: dict[str, int] = {}
        if num_steps is None:
            for intervals in parsed.values():
                for mode, _, end in intervals:
                    steps[mode] = max(steps.get(mode, 0), end)
        elif not isinstance(num_steps, Mapping):
            problems.append(f"num_steps={num_steps!r} must be a mapping {{mode: int}}")
        else:
            for mode, n in num_steps.items():
                if not isinstance(mode, str) or not mode:
                    problems.append(f"num_steps: mode {mode!r} must be a non-empty str")
                elif not _is_int(n) or n < 1:
                    problems.append(f"num_steps[{mode!r}]={n!r} must be an int >= 1")
                else:
                    steps[mode] = int(n)
            for name, intervals in parsed.items():
                for mode, start, end in intervals:
                    if mode not in steps:
                        problems.append(
                            f"{name}: mode {mode!r} is not in num_steps ({', '.join(steps)})"
                        )
                    elif end > steps[mode]:
                        problems.append(
                            f"{name}: interval {(mode, start, end)!r} ends past "
                            f"num_steps[{mode!r}]={steps[mode]}"
                        )
        if not steps and not problems:
            problems.append(
                "lifetimes need at least one mode: give num_steps={mode: n} or some interval"
            )

        labels: dict[str, tuple[str, ...]] = {}
        if step_labels is not None:
            for mode, names in step_labels.items():
                names = tuple(str(x) for x in names)
                if mode not in steps:
                    problems.append(f"step_labels: mode {mode!r} is not a mode of these lifetimes")
                elif len(names) != steps[mode]:
                    problems.append(
                        f"step_labels[{mode!r}] has {len(names)} labels for num_steps={steps[mode]}"
                    )
                else:
                    labels[mode] = names
        if problems:
            raise ArenaError("invalid Lifetimes:\n  - " + "\n  - ".join(problems))

        live_items = tuple((name, _normalize(parsed[name], steps)) for name in sorted(parsed))
        object.__setattr__(self, "live_items", live_items)
        object.__setattr__(self, "steps_items", tuple(sorted(steps.items())))
        object.__setattr__(self, "labels_items", tuple(sorted(labels.items())))
        # Read-only views, built once (not dataclass fields: equality uses the tuples above).
        object.__setattr__(self, "_live", dict(live_items))
        object.__setattr__(self, "_steps", dict(self.steps_items))
        object.__setattr__(self, "_labels", dict(self.labels_items))

    # -- views ------------------------------------------------------------------------------

    @property
    def modes(self) -> tuple[str, ...]:
        """The modes, sorted by name."""
        return tuple(m for m, _ in self.steps_items)

    @property
    def num_steps(self) -> Mapping[str, int]:
        """`{mode: number of steps}` (read-only)."""
        return types.MappingProxyType(self._steps)

    @property
    def live(self) -> Mapping[str, tuple[Interval, ...]]:
        """`{name: intervals}` of the buffers named here (read-only; merged and sorted)."""
        return types.MappingProxyType(self._live)

    def __contains__(self, name: object) -> bool:
        return name in self._live

    def label(self, mode: str, step: int) -> str:
        """The label of `step` in `mode` (`""` when the lifetimes carry none)."""
        labels = self._labels.get(mode)
        return labels[step] if labels else ""

    def intervals(self, name: str) -> tuple[Interval, ...]:
        """The live intervals of `name`; for an unknown buffer, every step of every mode."""
        known = self._live.get(name)
        if known is not None:
            return known
        return tuple(Interval(m, 0, n) for m, n in self.steps_items)

    def conflicts(self, a: str, b: str) -> bool:
        """True when `a` and `b` are live at a common step of some mode (must not share bytes)."""
        return first_common(self.intervals(a), self.intervals(b)) is not None

    def common_step(self, a: str, b: str) -> Interval | None:
        """The first interval in which both `a` and `b` are live, or None."""
        return first_common(self.intervals(a), self.intervals(b))

    # -- bounds -----------------------------------------------------------------------------

    def peak(self, sizes: Any, *, align_bytes: int = 256, guard_bytes: int = 0) -> Peak:
        """The step with the most live bytes: the lower bound of any layout's size.

        Each non-empty buffer counts `round_up(nbytes + guard_bytes, align_bytes)` (what it
        occupies in a plan with that alignment); the peak is the maximum over modes and steps.
        No layout of `sizes` that respects these lifetimes is smaller (`ArenaPlan.packed`
        rounds its total up so that `total_bytes >= peak().bytes` always holds).

        Args:
          sizes: a `BufferSizes` or a `{name: nbytes}` mapping; names the lifetimes lack are
            unknown (live always), zero-size buffers are skipped, names the lifetimes have
            but `sizes` lacks are ignored.
          align_bytes: the plan's region alignment (a power of two).
          guard_bytes: the plan's guard band after each region.
        """
        footprint = _footprints(sizes, align_bytes, guard_bytes)
        best = Peak(0, self.modes[0], 0, ())
        for mode, _ in self.steps_items:
            # Sweep: at equal steps an end (-) comes before a start (+): intervals are half-open.
            events: list[tuple[int, int, str]] = []
            for name in footprint:
                for iv in self.intervals(name):
                    if iv.mode == mode:
                        events.append((iv.start, 1, name))
                        events.append((iv.end, 0, name))
            events.sort(key=lambda e: (e[0], e[1]))
            live_bytes = 0
            for step, kind, name in events:
                live_bytes += footprint[name] if kind else -footprint[name]
                if kind and live_bytes > best.bytes:
                    best = Peak(live_bytes, mode, step, ())
        if best.bytes:
            names = tuple(
                n
                for n in footprint
                if any(
                    iv.mode == best.mode and iv.start <= best.step < iv.end
                    for iv in self.intervals(n)
                )
            )
            best = best._replace(names=names)
        return best

    def lower_bound_bytes(self, sizes: Any, *, align_bytes: int = 256, guard_bytes: int = 0) -> int:
        """`peak(sizes, ...).bytes`: no plan of `sizes` honouring these lifetimes is smaller.

        Use it to compare any plan, a sequential one included, with the best possible:
        `ArenaPlan.sequential(sizes).total_bytes / lifetimes.lower_bound_bytes(sizes)`.
        """
        return self.peak(sizes, align_bytes=align_bytes, guard_bytes=guard_bytes).bytes

    # -- combining --------------------------------------------------------------------------

    def __or__(self, other: Lifetimes) -> Lifetimes:
        """Union of two lifetimes, e.g. a decode and a prefill recording.

        A mode present in both must have the same step count; its intervals are united. A
        buffer named by only one side is dead in the other side's modes (each side is taken
        to cover whole passes of its modes).
        """
        if not isinstance(other, Lifetimes):
            return NotImplemented
        steps = dict(self.steps_items)
        for mode, n in other.steps_items:
            if steps.get(mode, n) != n:
                raise ArenaError(
                    f"cannot merge lifetimes: mode {mode!r} has num_steps={steps[mode]} on one "
                    f"side and {n} on the other (rename one mode)"
                )
            steps[mode] = n
        live: dict[str, list[Interval]] = {}
        for side in (self, other):
            for name, intervals in side.live_items:
                live.setdefault(name, []).extend(intervals)
        labels = dict(self.labels_items)
        labels.update(other.labels_items)
        return Lifetimes(live, num_steps=steps, step_labels=labels)

    # -- sources ----------------------------------------------------------------------------

    @classmethod
    def standard(cls, config: Any) -> Lifetimes:
        """The documented table (module docstring) for the seed's standard layer schedule.

        Covers all 46 `BufferSizes` fields in the modes `prefill`, `decode` and `verify`; the
        steps are the phases of `standard_schedule(config)` (also the step labels).
        """
        phases, live = schedule.standard_live(config)
        return cls(
            live,
            num_steps={m: len(phases) for m in schedule.MODES},
            step_labels={m: phases for m in schedule.MODES},
        )

    @classmethod
    def from_events(
        cls,
        events: Sequence[tuple[str, str]],
        *,
        mode: str,
        live_out: Iterable[str] = (),
    ) -> Lifetimes:
        """Lifetimes of one pass from its `(kind, name)` arena events, in program order.

        Event `i` is step `i`. A region is live from a write to the last view before its next
        write; a view with no earlier write in the pass is live from step 0 (an input); a
        region written and not viewed afterwards, or named in `live_out`, stays live to the
        end (the caller reads it). Two writes with no view between them share one interval:
        a write stores a prefix of the region, so the first write's tail may still be read.

        The rule assumes that what a view reads was stored by the writes since the previous
        view-free gap; a step that rewrites a region's header and later reads its older tail
        after a view in between must list the region in `live_out` or keep it unknown.
        """
        if not isinstance(mode, str) or not mode:
            raise ArenaError(f"mode={mode!r} must be a non-empty str")
        if isinstance(events, str | bytes) or not isinstance(events, Iterable):
            raise ArenaError(f"events={events!r:.80} must be a sequence of (kind, name) pairs")
        events = list(events)
        bad = [e for e in events if not (isinstance(e, tuple) and len(e) == 2
                                         and isinstance(e[1], str))]  # fmt: skip
        if bad:
            raise ArenaError(
                f"events must be (kind, region name) pairs of strs; got {bad[0]!r:.80} "
                f"({len(bad)} bad)"
            )
        if isinstance(live_out, str) or not all(isinstance(n, str) for n in live_out):
            raise ArenaError(f"live_out={live_out!r:.80} must be an iterable of region names")
        live_out = frozenset(live_out)
        n = max(len(events), 1)
        opened: dict[str, int] = {}
        last_view: dict[str, int] = {}
        live: dict[str, list[tuple[str, int, int]]] = {}
        for step, (kind, name) in enumerate(events):
            if kind == "write":
                start = opened.get(name)
                if start is not None and last_view.get(name, -1) >= start:
                    live.setdefault(name, []).append((mode, start, last_view[name] + 1))
                    opened[name] = step
                elif start is None:
                    opened[name] = step
            elif kind == "view":
                opened.setdefault(name, 0)
                last_view[name] = step
            else:
                raise ArenaError(f"event kind={kind!r} must be 'view' or 'write'")
        for name, start in opened.items():
            viewed = last_view.get(name, -1) >= start
            end = last_view[name] + 1 if viewed and name not in live_out else n
            live.setdefault(name, []).append((mode, start, end))
        labels = [f"{kind} {name}" for kind, name in events] or ["(no events)"]
        return cls(live, num_steps={mode: n}, step_labels={mode: labels})


# -- helpers -----------------------------------------------------------------------------------


def _normalize(
    intervals: list[tuple[str, int, int]], steps: Mapping[str, int]
) -> tuple[Interval, ...]:
    """Sorted by (mode, start), overlapping and touching intervals of a mode merged."""
    out: list[Interval] = []
    for mode, start, end in sorted(intervals):
        if out and out[-1].mode == mode and start <= out[-1].end:
            if end > out[-1].end:
                out[-1] = Interval(mode, out[-1].start, end)
        else:
            out.append(Interval(mode, start, end))
    return tuple(out)


def first_common(a: Sequence[Interval], b: Sequence[Interval]) -> Interval | None:
    # Both are sorted by (mode, start) and disjoint within a mode: a two-pointer merge.
    i = j = 0
    while i < len(a) and j < len(b):
        x, y = a[i], b[j]
        if x.mode != y.mode:
            if x.mode < y.mode:
                i += 1
            else:
                j += 1
            continue
        lo, hi = max(x.start, y.start), min(x.end, y.end)
        if lo < hi:
            return Interval(x.mode, lo, hi)
        if x.end <= y.end:
            i += 1
        else:
            j += 1
    return None


def _footprints(sizes: Any, align_bytes: int, guard_bytes: int) -> dict[str, int]:
    """`{name: round_up(nbytes + guard, align)}` of the non-empty buffers of `sizes`."""
    align_bytes, guard_bytes = as_index(align_bytes), as_index(guard_bytes)
    if not _is_pow2(align_bytes):
        raise ArenaError(f"align_bytes={align_bytes!r} must be a power of two")
    if not _is_int(guard_bytes) or guard_bytes < 0:
        raise ArenaError(f"guard_bytes={guard_bytes!r} must be an int >= 0")
    return {
        name: _round_up(nbytes + guard_bytes, align_bytes)
        for name, nbytes in _size_items(sizes)
        if nbytes
    }
