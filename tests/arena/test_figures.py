"""The pictures (issue 19): the packed plan's offset-by-time map, the sequential strip and the
budget bars, read back from the figures' artists (never from pixels).

What is checked: every rectangle is a region's bytes over one of its live intervals and
nothing else is drawn; no two rectangles overlap in both steps and bytes (and a deliberately
broken plan shows that this check finds a packing bug); ticks sit on the multiples of one
power-of-two unit; a buffer has one colour in every picture; every buffer is labelled or in
the legend.
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib", reason="the pictures are an optional extra: jaxarena[plot]")

from matplotlib.colors import to_hex  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402

from jaxarena import (
    ArenaError,
    ArenaPlan,
    BufferSizes,
    Levers,
    Lifetimes,
    MemoryBudget,
    ModelConfig,
    Target,
)
from jaxarena._arena.plan import Region
from jaxarena._arena.report import draw_plan
from jaxarena._figure import binary_ticks, buffer_colour, format_tick
from jaxarena._sizing.budget import budget_segments, draw_budget

# A hybrid (attention + gated delta net, MoE), an MLA MoE and a Mamba-2 hybrid: the three
# shapes of the schedule table.
PRESETS = ("qwen3-next-80b-a3b", "deepseek-v3", "nemotron-h-8b")


def _sizes(name: str) -> tuple[ModelConfig, BufferSizes]:
    config = ModelConfig.preset(name)
    sizes = BufferSizes.from_config(config, 8192, 32768, 16, 64, levers=Levers(),
                                    target=Target.preset("hopper"))  # fmt: skip
    return config, sizes


@pytest.fixture(scope="module", params=PRESETS)
def drawn(request):
    import matplotlib.pyplot as plt

    config, sizes = _sizes(request.param)
    plan = ArenaPlan.packed(sizes, Lifetimes.standard(config))
    seq = ArenaPlan.sequential(sizes)
    fig = draw_plan(plan, title=request.param, sequential=seq)
    yield plan, seq, fig
    plt.close(fig)


def panels(fig) -> dict[str, object]:
    """`{axes label: axes}` of the plan's panels (`map:<modes>`, `strip:<name>`)."""
    return {ax.get_label(): ax for ax in fig.axes}


def rects(ax) -> list[tuple[str, float, float, float, float]]:
    """`(buffer, x0, x1, y0, y1)` of every buffer rectangle drawn on `ax`."""
    out = []
    for a in ax.get_children():
        if isinstance(a, Rectangle) and a.get_gid():
            x, y = a.get_xy()
            out.append((a.get_gid(), x, x + a.get_width(), y, y + a.get_height()))
    return out


def overlapping(ax) -> list[tuple[str, str]]:
    """Pairs of buffers whose rectangles overlap in both x (steps) and y (bytes): two buffers
    live at the same step in the same bytes. Half-open on both axes, so touching is fine."""
    found = set()
    for a, b in itertools.combinations(rects(ax), 2):
        if a[0] != b[0] and a[1] < b[2] and b[1] < a[2] and a[3] < b[4] and b[3] < a[4]:
            found.add(tuple(sorted((a[0], b[0]))))
    return sorted(found)


def test_every_rectangle_is_a_region_over_one_live_interval(drawn):
    plan, seq, fig = drawn
    axes = panels(fig)
    maps = {k[len("map:") :]: ax for k, ax in axes.items() if k.startswith("map:")}
    # The standard lifetimes differ in every mode (verify is the union of the other two).
    assert sorted(maps) == ["decode", "prefill", "verify"]
    lt = plan.lifetimes
    for mode, ax in maps.items():
        expected = sorted(
            (r.name, float(iv.start), float(iv.end), float(r.offset_bytes), float(r.end_bytes))
            for r in plan.region_list
            for iv in lt.intervals(r.name)
            if iv.mode == mode
        )
        assert sorted(rects(ax)) == expected, mode
        assert ax.get_xlim() == (0, lt.num_steps[mode])
    strip = sorted(rects(axes["strip:sequential"]))
    assert strip == sorted(
        (r.name, 0.0, 1.0, float(r.offset_bytes), float(r.end_bytes)) for r in seq.region_list
    )


def test_no_two_rectangles_overlap_in_steps_and_bytes(drawn):
    plan, _, fig = drawn
    for label, ax in panels(fig).items():
        if label.startswith("map:"):
            assert overlapping(ax) == [], label


def test_the_overlap_check_finds_a_packing_bug():
    # Move one buffer of a real packed plan onto a buffer it is live with. ArenaPlan accepts
    # the layout (the pair is declared aliasable), validate() rejects it, and the picture
    # shows exactly the pairs that validate names.
    import matplotlib.pyplot as plt

    config, sizes = _sizes("qwen3-next-80b-a3b")
    lt = Lifetimes.standard(config)
    good = ArenaPlan.packed(sizes, lt)
    victim, mover = good.regions["qkv_output"], "ssm_deinterleaved"
    assert lt.conflicts(victim.name, mover)
    regions = tuple(
        Region(r.name, victim.offset_bytes, r.nbytes) if r.name == mover else r
        for r in good.region_list
    )
    end = max(r.end_bytes for r in regions)
    names = [r.name for r in regions]
    everything = frozenset(frozenset(p) for p in itertools.combinations(names, 2))
    bad = ArenaPlan(regions, math.ceil(max(end, good.total_bytes) / 256) * 256,
                    may_alias=everything, lifetimes=lt)  # fmt: skip
    with pytest.raises(ArenaError, match="share bytes"):
        bad.validate()
    expected = set()
    for a, b in itertools.combinations(regions, 2):
        if (
            a.offset_bytes < b.end_bytes
            and b.offset_bytes < a.end_bytes
            and lt.conflicts(a.name, b.name)
        ):
            expected.add(tuple(sorted((a.name, b.name))))
    assert expected and all(mover in p for p in expected)
    fig = draw_plan(bad)
    try:
        found = set()
        for ax in panels(fig).values():
            found |= set(overlapping(ax))
        assert found == expected
    finally:
        plt.close(fig)


def test_buffers_sharing_bytes_at_different_steps_do_not_overlap():
    # The converse: a legitimate share (disjoint lifetimes, same bytes) is not flagged, and a
    # conflict in only one mode shows in that mode's panel only.
    import matplotlib.pyplot as plt

    lt = Lifetimes(
        {"a": [("prefill", 0, 2), ("decode", 0, 2)], "b": [("prefill", 2, 4), ("decode", 1, 3)]},
        num_steps={"prefill": 4, "decode": 4},
    )
    ok = ArenaPlan.packed({"a": 1024, "b": 1024}, Lifetimes(
        {"a": [("prefill", 0, 2)], "b": [("prefill", 2, 4)]}, num_steps={"prefill": 4}))  # fmt: skip
    assert ok.regions["a"].offset_bytes == ok.regions["b"].offset_bytes
    shared = ArenaPlan(ok.region_list, ok.total_bytes, may_alias=ok.may_alias, lifetimes=lt)
    fig = draw_plan(shared)
    try:
        axes = panels(fig)
        assert overlapping(axes["map:prefill"]) == []
        assert overlapping(axes["map:decode"]) == [("a", "b")]
    finally:
        plt.close(fig)


def test_modes_with_equal_lifetimes_share_a_panel():
    import matplotlib.pyplot as plt

    lt = Lifetimes(
        {"a": [("prefill", 0, 2), ("verify", 0, 2)], "b": [("prefill", 2, 3), ("verify", 2, 3),
                                                            ("decode", 0, 3)]},
        num_steps={"prefill": 3, "decode": 3, "verify": 3},
    )  # fmt: skip
    plan = ArenaPlan.packed({"a": 4096, "b": 512}, lt)
    fig = draw_plan(plan)
    try:
        assert sorted(panels(fig)) == ["map:decode", "map:prefill = verify"]
    finally:
        plt.close(fig)
    with pytest.raises(ArenaError, match="train"):
        draw_plan(plan, modes=["train"])


def test_lines_at_the_lower_bound_and_the_total(drawn):
    plan, _, fig = drawn
    for ax in panels(fig).values():
        ys = {ln.get_gid(): ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_gid()}
        assert ys == {"lower_bound": plan.lower_bound_bytes, "plan_total": plan.total_bytes}


def _assert_binary_ticks(values, top):
    ticks = [int(v) for v in values]
    assert all(v == t for v, t in zip(values, ticks, strict=True))
    unit = ticks[1] - ticks[0]
    assert unit > 0 and unit & (unit - 1) == 0  # a power of two
    assert ticks == [k * unit for k in range(len(ticks))]
    assert 4 <= len(ticks) <= 10 and ticks[-1] <= top < ticks[-1] + 2 * unit


def test_ticks_are_multiples_of_a_power_of_two_unit(drawn):
    plan, seq, fig = drawn
    first = panels(fig)["strip:sequential"]
    top = first.get_ylim()[1]
    assert top >= max(plan.total_bytes, seq.total_bytes)
    _assert_binary_ticks(list(first.get_yticks()), top)
    shown = [t.get_text() for t in first.get_yticklabels()]
    assert shown == [format_tick(int(v)) for v in first.get_yticks()]


@pytest.mark.parametrize("top", [5, 9, 10, 17, 1000, 4096, 10**6, 1.3 * 2**30, 2.2 * 2**30,
                                 1 << 40, 3 * 10**12 + 1])  # fmt: skip
def test_binary_ticks(top):
    unit, ticks = binary_ticks(top)
    _assert_binary_ticks(ticks, top)
    # The smallest such unit: half of it would need more than 10 ticks.
    assert unit == 1 or int(top // (unit // 2)) + 1 > 10


@pytest.mark.parametrize(
    "value, text",
    [(0, "0"), (96, "96 B"), (1024, "1 KiB"), (256 << 20, "256 MiB"), (768 << 20, "768 MiB"),
     (1 << 30, "1 GiB"), (5 << 28, "1.25 GiB"), (1088 << 20, "1088 MiB"), (3 << 39, "1.5 TiB")],
)  # fmt: skip
def test_tick_labels(value, text):
    assert format_tick(value) == text


def _colours(fig) -> dict[str, set[str]]:

    out: dict[str, set[str]] = {}
    for ax in fig.axes:
        for a in ax.get_children():
            if isinstance(a, Rectangle) and a.get_gid():
                out.setdefault(a.get_gid(), set()).add(to_hex(a.get_facecolor()))
    return out


def test_a_buffer_has_one_colour_in_every_picture(drawn):
    import matplotlib.pyplot as plt

    _, _, fig = drawn
    config, sizes = _sizes("qwen3-8b")
    other = draw_plan(ArenaPlan.sequential(sizes))
    try:
        mine, theirs = _colours(fig), _colours(other)
        assert all(len(c) == 1 for c in mine.values())
        common = set(mine) & set(theirs)
        assert len(common) > 15
        assert all(mine[n] == theirs[n] == {buffer_colour(n)} for n in common)
    finally:
        plt.close(other)
    # Every buffer of the seed has its own colour.
    names = list(BufferSizes.__dataclass_fields__)
    assert len({buffer_colour(n) for n in names}) == len(names)
    # A name outside the seed gets its colour from the name's bytes, not from Python's
    # per-process string hash: another interpreter with another hash seed agrees.
    other = subprocess.run(
        [sys.executable, "-c", "from jaxarena._figure import buffer_colour as c; print(c('my_b'))"],
        env={**os.environ, "PYTHONHASHSEED": "7"}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert other.stdout.strip() == buffer_colour("my_b")


def test_every_buffer_is_labelled_or_in_the_legend(drawn):
    _, _, fig = drawn
    keyed = {
        t.get_gid()[4:]: t.get_text() for t in fig.texts if str(t.get_gid()).startswith("key:")
    }
    swatches = {
        a.get_gid()[7:]: a for a in fig.get_children() if str(a.get_gid()).startswith("swatch:")
    }
    for name, text in keyed.items():  # a key row names its buffer (or line) beside its colour
        assert text.startswith(f"{name} ") or name in ("plan_total", "lower_bound"), text
        if name not in ("plan_total", "lower_bound"):
            assert to_hex(swatches[name].get_facecolor()) == buffer_colour(name)
    legend = set(keyed)
    for label, ax in panels(fig).items():
        boxes = {}
        for name, x0, x1, y0, y1 in rects(ax):
            boxes.setdefault(name, []).append((x0, x1, y0, y1))
        texts = [a for a in ax.get_children() if isinstance(a, Text) and a.get_gid() in boxes]
        for t in texts:  # a label sits inside one of its buffer's rectangles
            x, y = t.get_position()
            assert any(x0 < x < x1 and y0 < y < y1 for x0, x1, y0, y1 in boxes[t.get_gid()])
            assert t.get_text().startswith(t.get_gid())
        labelled = {t.get_gid() for t in texts}
        assert set(boxes) <= labelled | legend, label


def test_budget_bars_are_the_segments():
    import matplotlib.pyplot as plt

    b = MemoryBudget(config=ModelConfig.preset("qwen3-30b-a3b"), memory_bytes=141 * 10**9,
                     tp=4, ep=4, weights="fp8", levers=Levers(),
                     target=Target.preset("hopper"))  # fmt: skip
    fig = draw_budget(b, title="qwen3-30b-a3b")
    try:
        (ax,) = fig.axes
        keys = ("weights", "arena", "reserve", "kv", "state", "free")
        want = [(k, n) for k, (_, n) in zip(keys, budget_segments(b), strict=True) if n]
        bars: dict[float, list[tuple[str, float, float]]] = {}
        for a in ax.patches:
            bars.setdefault(a.get_x(), []).append((a.get_gid(), a.get_y(), a.get_height()))
        assert len(bars) == 4
        for stack in bars.values():
            bottom = 0
            for (key, y, h), (wkey, n) in zip(sorted(stack, key=lambda s: s[1]), want,
                                              strict=True):  # fmt: skip
                assert (key, y, h) == (wkey, bottom, n)
                bottom += n
        (memory,) = [ln for ln in ax.get_lines() if ln.get_gid() == "memory"]
        assert memory.get_ydata()[0] == b.memory_bytes
        _assert_binary_ticks(list(ax.get_yticks()), ax.get_ylim()[1])
        title = ax.get_title(loc="left")
        assert "qwen3-30b-a3b [qwen3_moe]" in title and "target hopper" in title
        assert "max_batch_tokens=8192" in title and ("fits" in title) == b.fits
    finally:
        plt.close(fig)


def test_a_plan_without_lifetimes_is_one_strip_and_an_empty_plan_draws():
    import matplotlib.pyplot as plt

    plan = ArenaPlan.sequential({"a": 1000, "b": 0, "c": 5000})
    fig = draw_plan(plan, title="t")
    try:
        (ax,) = fig.axes
        assert ax.get_label() == "strip:plan"
        assert sorted(rects(ax)) == [("a", 0.0, 1.0, 0.0, 1000.0), ("c", 0.0, 1.0, 1024.0, 6024.0)]
        assert [ln.get_gid() for ln in ax.get_lines() if ln.get_gid()] == []
    finally:
        plt.close(fig)
    lt = Lifetimes({"a": [("decode", 0, 1)]}, num_steps={"decode": 2})
    empty = ArenaPlan.packed({"a": 0}, lt)
    fig = draw_plan(empty)
    try:
        assert [rects(ax) for ax in fig.axes] == [[]]
        assert "lower bound 0 B" in fig.get_suptitle()
    finally:
        plt.close(fig)
