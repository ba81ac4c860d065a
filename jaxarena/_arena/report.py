"""Reports on a plan: `packing_report` (the numbers `jaxarena plan --packed` prints) and its
picture (`draw_plan`, `plot_plan`; matplotlib, an optional dependency).

The picture of a packed plan is the offset-by-time memory map of XLA's and TFLite's planners:
x = the steps of the schedule, y = byte offset, one rectangle per live interval of a buffer.
Two rectangles that overlap in both x and y are two buffers sharing bytes while both are live:
a packing bug shows as overlapping rectangles. A sequential plan is one strip on the same y
scale. Style, ticks and colours come from `jaxarena._figure`.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections.abc import Sequence
from typing import Any

from jaxarena._arena import schedule
from jaxarena._arena.lifetimes import Lifetimes
from jaxarena._arena.plan import ArenaPlan
from jaxarena._errors import ArenaError
from jaxarena._figure import (
    KeyEntry,
    binary_ticks,
    buffer_colour,
    draw_key,
    figure_title,
    format_tick,
    output_path,
    pyplot,
    save,
)
from jaxarena._units import format_bytes, plural, round_up

__all__ = ["draw_plan", "packing_report", "plot_plan"]


def packing_report(
    sizes: Any,
    lifetimes: Lifetimes,
    align_bytes: int = 256,
    *,
    packed: ArenaPlan | None = None,
) -> dict[str, Any]:
    """The numbers behind `jaxarena plan --packed`, as plain JSON-ready data.

    `packed` may pass `ArenaPlan.packed(sizes, lifetimes, align_bytes=align_bytes)` when the
    caller has it already (the CLI draws it too), so that it is not packed twice.

    Returns:
      `{"sequential_bytes", "packed_bytes", "lower_bound_bytes", "peak", "regions"}`: the
      totals of `ArenaPlan.sequential(sizes)` and `ArenaPlan.packed(sizes, lifetimes)`, the
      lower bound (`lifetimes.lower_bound_bytes`), the peak as `[mode, step, label]`, and one
      dict per region in the order of `sizes`: `name`, `offset_bytes`, `nbytes` and `live`,
      a list of `[mode, start, end]` half-open step intervals (every step of every mode for a
      buffer the lifetimes do not name).
    """
    seq = ArenaPlan.sequential(sizes, align_bytes=align_bytes)
    plan = (
        packed
        if packed is not None
        else ArenaPlan.packed(sizes, lifetimes, align_bytes=align_bytes)
    )
    peak = lifetimes.peak(sizes, align_bytes=align_bytes)
    return {
        "sequential_bytes": seq.total_bytes,
        "packed_bytes": plan.total_bytes,
        "lower_bound_bytes": peak.bytes,
        "peak": [peak.mode, peak.step, lifetimes.label(peak.mode, peak.step)],
        "regions": [
            {
                "name": r.name,
                "offset_bytes": r.offset_bytes,
                "nbytes": r.nbytes,
                "live": [list(iv) for iv in lifetimes.intervals(r.name)],
            }
            for r in plan.region_list
        ],
    }


# -- the memory map ----------------------------------------------------------------------------

_FONT = 6.5  # points, every label in a panel
_KEY_COLUMN_IN = 2.5  # inches per column of the key
_CHAR_W = 0.56  # a character's width as a share of the font size (DejaVu Sans, average)
_LINE_H = 1.3  # a line's height as a share of the font size


@dataclasses.dataclass
class _Panel:
    """One axes of the picture: a sequential strip or the map of one group of modes."""

    kind: str  # "strip" or "map"
    name: str  # "sequential"/"plan" for a strip; the modes, "prefill = verify", for a map
    steps: int  # x extent: number of steps (1 for a strip)
    rects: list[tuple[str, float, float, int, int]]  # (buffer, x0, x1, offset, nbytes)
    ticks: list[tuple[float, str]] = dataclasses.field(default_factory=list)
    separators: list[int] = dataclasses.field(default_factory=list)
    title: str = ""
    width_in: float = 1.3


def _mode_order(modes: Sequence[str]) -> list[str]:
    known = [m for m in schedule.MODES if m in modes]
    return known + sorted(m for m in modes if m not in known)


def _map_panels(plan: ArenaPlan, modes: Sequence[str] | None) -> list[_Panel]:
    lt = plan.lifetimes
    assert lt is not None
    chosen = _mode_order(lt.modes if modes is None else modes)
    unknown = [m for m in chosen if m not in lt.num_steps]
    if unknown:
        raise ArenaError(
            f"modes {unknown} are not modes of the plan's lifetimes ({', '.join(lt.modes)})"
        )
    # Modes whose steps, labels and intervals are all equal share one panel.
    groups: dict[tuple, list[str]] = {}
    for mode in chosen:
        n = lt.num_steps[mode]
        key = (
            n,
            tuple(lt.label(mode, i) for i in range(n)),
            tuple(
                (
                    r.name,
                    tuple((iv.start, iv.end) for iv in lt.intervals(r.name) if iv.mode == mode),
                )
                for r in plan.region_list
            ),
        )
        groups.setdefault(key, []).append(mode)
    panels = []
    for group in groups.values():
        mode = group[0]
        n = lt.num_steps[mode]
        rects = [
            (r.name, float(iv.start), float(iv.end), r.offset_bytes, r.nbytes)
            for r in plan.region_list
            for iv in lt.intervals(r.name)
            if iv.mode == mode
        ]
        labels = [lt.label(mode, i) or str(i) for i in range(n)]
        width = min(max(0.14 * n, 2.6), 7.5)
        room = width * 72 / (_FONT * 1.3)  # rotated labels side by side
        every = max(1, math.ceil(n / room))
        ticks = [(i + 0.5, labels[i]) for i in range(0, n, every)]
        blocks = [lab.split(".", 1)[0] if "." in lab else "" for lab in labels]
        separators = [i for i in range(1, n) if blocks[i] != blocks[i - 1]]
        peak_bytes, peak_step = _mode_peak(plan, mode)
        title = f"{' = '.join(group)}: peak {format_bytes(peak_bytes)} at {labels[peak_step]}"
        panels.append(_Panel("map", " = ".join(group), n, rects, ticks, separators, title, width))
    return panels


def _mode_peak(plan: ArenaPlan, mode: str) -> tuple[int, int]:
    """`(bytes, step)`: the most bytes live at one step of `mode` (footprints as in the plan)."""
    lt = plan.lifetimes
    assert lt is not None
    live = [0] * lt.num_steps[mode]
    for r in plan.region_list:
        foot = round_up(r.nbytes + plan.guard_bytes, plan.align_bytes)
        for iv in lt.intervals(r.name):
            if iv.mode == mode:
                for s in range(iv.start, iv.end):
                    live[s] += foot
    step = max(range(len(live)), key=lambda s: (live[s], -s))
    return live[step], step


def _strip(plan: ArenaPlan, name: str) -> _Panel:
    rects = [(r.name, 0.0, 1.0, r.offset_bytes, r.nbytes) for r in plan.region_list]
    title = f"{name}\n{format_bytes(plan.total_bytes)}"
    return _Panel("strip", name, 1, rects, title=title, width_in=1.35)


def _label_for(name: str, nbytes: int, w_pt: float, h_pt: float) -> tuple[str, int] | None:
    """The text and rotation of a rectangle's label, or None when none fits."""
    full, size = f"{name} {format_bytes(nbytes)}", format_bytes(nbytes)

    def fits(text: str, w: float, h: float) -> bool:
        lines = text.split("\n")
        return (
            max(len(t) for t in lines) * _CHAR_W * _FONT + 3 <= w
            and len(lines) * _LINE_H * _FONT + 1 <= h
        )

    for text, rot in ((full, 0), (f"{name}\n{size}", 0), (full, 90), (name, 0), (name, 90)):
        if fits(text, w_pt, h_pt) if rot == 0 else fits(text, h_pt, w_pt):
            return text, rot
    return None


def draw_plan(
    plan: ArenaPlan,
    *,
    title: str | None = None,
    context: Sequence[str] = (),
    sequential: ArenaPlan | None = None,
    modes: Sequence[str] | None = None,
) -> Any:
    """The picture of `plan` as a matplotlib `Figure` (what `plot_plan` saves).

    A plan with lifetimes (a packed plan) is drawn as its offset-by-time map: one panel per
    group of modes with equal lifetimes, x = the steps of the schedule (phase names on the
    axis), y = byte offset, one rectangle `[start, end) x [offset, offset + nbytes)` per live
    interval of every region; a line at the lower bound and one at the plan's total. With
    `sequential`, that plan's strip comes first on the same y scale. A plan without lifetimes
    is drawn as one strip. Rectangles large enough carry their name (and size); every buffer
    left without a label in some panel is in the legend, with its size. Every rectangle and
    label has its buffer's name as `gid`; every axes is labelled `"map:<modes>"` or
    `"strip:<name>"`; the lines have the gids `"lower_bound"` and `"plan_total"`.

    Args:
      plan: the plan to draw.
      title: the first title line (default: `"arena"`); the totals are added.
      context: more title lines (limits, target, mesh).
      sequential: a plan of the same buffers to draw beside a packed plan for comparison.
      modes: the modes to draw (default: every mode of the lifetimes).

    Raises:
      ImportError: matplotlib is not installed.
      ArenaError: a mode that the lifetimes lack.
    """
    plt = pyplot()
    from matplotlib.patches import Rectangle

    panels: list[_Panel] = []
    if sequential is not None:
        panels.append(_strip(sequential, "sequential"))
    if plan.lifetimes is None:
        panels.append(_strip(plan, "plan"))
        panels[-1].width_in = 3.0  # the only panel: room for the labels
    else:
        panels.extend(_map_panels(plan, modes))
    has_map = any(p.kind == "map" for p in panels)
    top = max(p.total_bytes for p in ([plan] + ([sequential] if sequential else [])))
    y_max = top * 1.03
    lower = plan.lower_bound_bytes if plan.lifetimes is not None else None

    # Geometry in inches, known before drawing, so that label fitting needs no renderer.
    left, gap, right_pad = 0.95, 0.3, 0.25
    axes_h = 6.0
    bottom = 1.1 if has_map else 0.35
    pt_per_byte = axes_h * 72 / y_max

    labels: dict[int, list[tuple[str, float, float, str, int]]] = {}
    unlabelled: set[str] = set()  # buffers without a label in some panel that draws them
    for k, p in enumerate(panels):
        pt_per_step = p.width_in * 72 / p.steps
        chosen = labels.setdefault(k, [])
        by_name: dict[str, list[tuple[str, float, float, int, int]]] = {}
        for rect in p.rects:
            by_name.setdefault(rect[0], []).append(rect)
        for name, rects in by_name.items():
            for _, x0, x1, off, nb in sorted(rects, key=lambda r: -(r[2] - r[1])):
                found = _label_for(name, nb, (x1 - x0) * pt_per_step, nb * pt_per_byte)
                if found:
                    chosen.append((name, (x0 + x1) / 2, off + nb / 2, *found))
                    break
            else:
                unlabelled.add(name)
    drawn = {rect[0]: rect[4] for p in panels for rect in p.rects}
    legend_names = [n for n in drawn if n in unlabelled]
    legend_cols = 1 if len(legend_names) <= 36 else 2
    legend_w = _KEY_COLUMN_IN * legend_cols
    width = left + sum(p.width_in for p in panels) + gap * (len(panels) - 1) + legend_w + right_pad
    text = figure_title(title or "arena", context, _totals(plan, sequential))
    chars = max(40, int((width - left) * 72 / (9 * 0.58)))  # 9-point title characters per line
    lines = [w for line in text.split("\n") for w in textwrap.wrap(line, chars)]
    height = bottom + axes_h + 0.2 + 0.17 * len(lines) + 0.38

    fig = plt.figure(figsize=(width, height))
    x = left
    first = None
    for k, p in enumerate(panels):
        ax = fig.add_axes((x / width, bottom / height, p.width_in / width, axes_h / height))
        x += p.width_in + gap
        ax.set_label(f"{p.kind}:{p.name}")
        for name, x0, x1, off, nb in p.rects:
            # add_artist: the limits are set below, so skip add_patch's per-patch update.
            ax.add_artist(Rectangle((x0, off), x1 - x0, nb, facecolor=buffer_colour(name),
                                   edgecolor="white", linewidth=0.4, gid=name))  # fmt: skip
        for name, cx, cy, text, rot in labels[k]:
            ax.text(cx, cy, text, ha="center", va="center", rotation=rot, fontsize=_FONT,
                    color=_ink(buffer_colour(name)), gid=name, clip_on=True)  # fmt: skip
        ax.set_xlim(0, p.steps)
        if p.kind == "map":
            # Phase names as plain text under the axis: much cheaper than one Tick per step.
            below = ax.get_xaxis_transform()
            for t, lab in p.ticks:
                ax.text(t, -0.008, lab, transform=below, rotation=90, ha="center", va="top",
                        fontsize=_FONT, gid="step")  # fmt: skip
            ax.set_xticks([])
            for s in p.separators:
                ax.axvline(s, color="0.55", lw=0.6, ls=":", zorder=0.5)
        else:
            ax.set_xticks([])
        if lower is not None:
            ax.axhline(lower, color="#c44e52", lw=1.0, ls="--", gid="lower_bound")
            ax.axhline(plan.total_bytes, color="black", lw=0.9, gid="plan_total")
        ax.set_title(p.title, fontsize=8)
        ax.set_ylim(0, y_max)
        for t in binary_ticks(y_max)[1][1:]:  # faint lines at the ticks, in every panel
            ax.axhline(t, color="0.9", lw=0.5, zorder=0)
        if first is None:
            first = ax
            _, ticks = binary_ticks(y_max)
            ax.set_yticks(ticks, [format_tick(t) for t in ticks], fontsize=7)
            ax.set_ylabel("byte offset", fontsize=8)
        else:  # the same y scale; the first panel carries the ticks
            ax.set_yticks([])
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)

    entries = []
    if lower is not None:
        entries += [
            KeyEntry(f"plan total {format_bytes(plan.total_bytes)}", "black", "plan_total", "-"),
            KeyEntry(f"lower bound {format_bytes(lower)}", "#c44e52", "lower_bound", "--"),
        ]
    entries += [
        KeyEntry(f"{n} {format_bytes(drawn[n])}", buffer_colour(n), n)
        for n in sorted(legend_names, key=lambda n: -drawn[n])
    ]
    if entries:
        draw_key(fig, entries, left_in=x - gap + 0.15, top_in=bottom + axes_h,
                 title=_legend_title(lower is not None, bool(legend_names)), fontsize=_FONT,
                 columns=legend_cols, column_in=_KEY_COLUMN_IN)  # fmt: skip
    fig.suptitle("\n".join(lines), x=left / width, ha="left", y=1 - 0.12 / height, va="top",
                 fontsize=9)  # fmt: skip
    return fig


def _legend_title(lines: bool, buffers: bool) -> str | None:
    if buffers:
        return "lines; buffers without a label" if lines else "buffers without a label"
    return None


def _totals(plan: ArenaPlan, sequential: ArenaPlan | None) -> str:
    parts = [plural(len(plan.region_list), "region")]
    if plan.lifetimes is not None:
        lb = plan.lower_bound_bytes
        head = f"packed {format_bytes(plan.total_bytes)}"
        if lb:
            head += f" = {plan.total_bytes / lb:.3f} x lower bound {format_bytes(lb)}"
        else:
            head += ", lower bound 0 B (nothing is live)"
        parts.insert(0, head)
    else:
        parts.insert(0, f"total {format_bytes(plan.total_bytes)}")
    if sequential is not None:
        parts.insert(1, f"sequential {format_bytes(sequential.total_bytes)} "
                     f"(packed/sequential {plan.total_bytes / sequential.total_bytes:.3f})")  # fmt: skip
    return ", ".join(parts)


def _ink(colour: str) -> str:
    r, g, b = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def plot_plan(
    plan: ArenaPlan,
    path: Any,
    *,
    title: str | None = None,
    context: Sequence[str] = (),
    sequential: ArenaPlan | None = None,
    modes: Sequence[str] | None = None,
    dpi: int = 100,
) -> str:
    """Saves `draw_plan(plan, ...)` to `path` (PNG unless the extension says otherwise;
    `.png` is added when `path` has none) and returns the path written.

    Raises:
      ImportError: matplotlib is not installed (`pip install "jaxarena[plot]"`).
    """
    out = output_path(path)
    fig = draw_plan(plan, title=title, context=context, sequential=sequential, modes=modes)
    save(fig, out, dpi=dpi)
    return out
