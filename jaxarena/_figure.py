"""The house style of every jaxarena picture (the plan's memory map, the budget's bars): one
way to load matplotlib, to name the output file, to put byte ticks on an axis, to colour a
buffer and to write a title. matplotlib is an optional dependency (`jaxarena[plot]`); nothing
here imports it at module level.

* Ticks fall on multiples of one power-of-two unit (`binary_ticks`): 0, 256 MiB, 512 MiB, ...,
  5 to 10 of them, labelled in binary units (`format_tick`).
* A buffer keeps its colour across pictures (`buffer_colour`): the seed's buffers take hues
  spaced by the golden angle in the seed's order, so neighbours in that order differ; any
  other name takes a hue from a CRC-32 of the name. The parts of a device budget have fixed
  colours (`PART_COLOURS`).
* Keys (`draw_key`) are plain artists in fixed rows, not a matplotlib `Legend`.
* Titles (`figure_title`) read: what and whose (model, kind), then the stated limits and
  target, then the totals.
"""

from __future__ import annotations

import colorsys
import dataclasses
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PART_COLOURS",
    "binary_ticks",
    "buffer_colour",
    "draw_key",
    "figure_title",
    "format_tick",
    "output_path",
    "pyplot",
    "save",
]

_GOLDEN = 0.618033988749895
# Lightness / saturation pairs cycled with the hue so that two hues that come out close still
# differ in shade.
_SHADES = ((0.55, 0.62), (0.42, 0.70), (0.66, 0.55))

# The parts of one device's memory in a budget picture (bottom to top).
PART_COLOURS = {
    "weights": "#4c72b0",
    "arena": "#dd8452",
    "reserve": "#8c8c8c",
    "kv": "#55a868",
    "state": "#8172b3",
    "free": "#ececec",
}


def pyplot() -> Any:
    """`matplotlib.pyplot` on the non-interactive Agg backend.

    Raises:
      ImportError: matplotlib is not installed (`pip install "jaxarena[plot]"`).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError('plotting needs matplotlib: pip install "jaxarena[plot]"') from e
    return plt


def output_path(path: Any) -> str:
    """The file a picture asked for as `path` is written to: `path` itself, or `path + ".png"`
    when it has no extension (matplotlib picks the format from the extension)."""
    text = str(path)
    return text if Path(text).suffix else f"{text}.png"


def save(fig: Any, out: str, **savefig_kwargs: Any) -> None:
    """Writes `fig` to `out` (`Figure.savefig`) and closes it, also when the write fails.

    A PNG is compressed at zlib level 1, not Pillow's default 6: for the 2000 x 800 pixel map
    of a large plan that encodes in 54 ms instead of 94 (measured on the CI machine) for 12%
    more bytes; a command-line picture is drawn more often than it is kept.
    """
    if Path(out).suffix.lower() == ".png":
        savefig_kwargs.setdefault("pil_kwargs", {"compress_level": 1})
    try:
        fig.savefig(out, **savefig_kwargs)
    finally:
        pyplot().close(fig)


def binary_ticks(top: float, *, max_ticks: int = 10) -> tuple[int, list[int]]:
    """Ticks from 0 to `top` at the multiples of one power-of-two unit.

    The unit is the smallest power of two (>= 1 byte) that gives at most `max_ticks` ticks in
    `[0, top]`; for `top >= 4.5` bytes this gives between `max_ticks // 2` and `max_ticks`
    ticks (halving the unit doubles their number).

    Returns:
      `(unit, [0, unit, 2 * unit, ...])`, every tick `<= top`.
    """
    if top < 0:
        raise ValueError(f"top={top!r} must be >= 0")
    unit = 1
    while top / unit > max_ticks - 1:
        unit *= 2
    return unit, [k * unit for k in range(int(top // unit) + 1)]


_BINARY = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))


def format_tick(value: int) -> str:
    """A tick value in the largest binary unit that shows it exactly with at most two
    decimals: `0`, `256 MiB`, `1.25 GiB`, `1088 MiB`, `96 B`."""
    value = int(value)
    if value == 0:
        return "0"
    for name, unit in _BINARY:
        if value >= unit and (value * 100) % unit == 0:
            text = f"{value / unit:.2f}".rstrip("0").rstrip(".")
            return f"{text} {name}"
    return f"{value} B"


def _seed_order() -> dict[str, int]:
    from jaxarena._sizing.buffers import BufferSizes

    return {f.name: i for i, f in enumerate(dataclasses.fields(BufferSizes))}


_ORDER: dict[str, int] | None = None


def buffer_colour(name: str) -> str:
    """The colour (`#rrggbb`) of buffer `name` in every picture: fixed per name."""
    global _ORDER
    if _ORDER is None:
        _ORDER = _seed_order()
    index = _ORDER.get(name)
    if index is None:
        hue = zlib.crc32(name.encode()) / 2**32
        index = zlib.crc32(name.encode()[::-1])
    else:
        hue = (index * _GOLDEN) % 1.0
    light, sat = _SHADES[index % len(_SHADES)]
    r, g, b = colorsys.hls_to_rgb(hue, light, sat)
    return "#{:02x}{:02x}{:02x}".format(*(round(255 * c) for c in (r, g, b)))


def figure_title(subject: str, context: Sequence[str] = (), totals: str = "") -> str:
    """The title of a picture: `subject` (model and what is drawn), the `context` lines
    (limits, target, mesh), then `totals`."""
    return "\n".join([subject, *[c for c in context if c], *([totals] if totals else [])])


@dataclasses.dataclass(frozen=True)
class KeyEntry:
    """One row of a key: a swatch of `colour` (a filled box, or a line of `linestyle` when it
    is given) and `label`; `name` (a buffer, a line) becomes the text's `gid`."""

    label: str
    colour: str
    name: str
    linestyle: str | None = None


def draw_key(
    fig: Any,
    entries: Sequence[KeyEntry],
    *,
    left_in: float,
    top_in: float,
    title: str | None = None,
    fontsize: float = 6.5,
    columns: int = 1,
    column_in: float = 2.5,
) -> None:
    """Draws a key (a legend) on `fig` as plain artists: per entry a swatch and a text, in rows
    of a fixed pitch (1.5 x `fontsize`) from `top_in` down, filled column by column.

    A matplotlib `Legend` measures every entry through its offset boxes before drawing it;
    for the 36 entries of a large plan map that cost 0.14 s of a 0.6 s render (measured on
    the CI machine), and fixed rows need no measuring. Texts have the gid `"key:" + name`,
    the title `"key-title"`; positions are in inches from the figure's bottom left.
    """
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    width, height = fig.get_size_inches()
    pitch = fontsize * 1.5 / 72
    y0 = top_in
    if title:
        fig.text(left_in / width, y0 / height, title, fontsize=fontsize + 0.5, ha="left",
                 va="top", gid="key-title")  # fmt: skip
        y0 -= 1.3 * pitch
    rows = -(-len(entries) // max(1, columns))
    swatch = 0.2
    for i, e in enumerate(entries):
        col, row = divmod(i, rows)
        x = left_in + col * column_in
        y = y0 - (row + 0.5) * pitch
        if e.linestyle is None:
            box = (x / width, (y - 0.32 * pitch) / height)
            fig.add_artist(Rectangle(box, swatch / width, 0.64 * pitch / height,
                                     transform=fig.transFigure, facecolor=e.colour,
                                     edgecolor="none", gid=f"swatch:{e.name}"))  # fmt: skip
        else:
            fig.add_artist(Line2D([x / width, (x + swatch) / width], [y / height] * 2,
                                  transform=fig.transFigure, color=e.colour, lw=1.0,
                                  ls=e.linestyle, gid=f"swatch:{e.name}"))  # fmt: skip
        fig.text((x + swatch + 0.08) / width, y / height, e.label, fontsize=fontsize,
                 ha="left", va="center_baseline", gid=f"key:{e.name}")  # fmt: skip
