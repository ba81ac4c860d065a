"""ArenaPlan.packed: exact layouts by hand, properties on random lifetimes, validation, guard
bands, the presets' numbers, and a packed arena running a step like a sequential one."""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxarena
from jaxarena import (
    ArenaError,
    ArenaPlan,
    BufferSizes,
    Levers,
    Lifetimes,
    ModelConfig,
    Region,
    Target,
    packing_report,
    record_lifetimes,
)
from jaxarena._arena.packing import _best_offset

GB10 = Target.preset("gb10")
LIMITS = [(8192, 262144, 64, 128), (2048, 131072, 16, 64)]


def offsets(plan):
    return {r.name: r.offset_bytes for r in plan.region_list}


# -- exact layouts (size-by-time diagrams: offset up, step right) ------------------------------


def test_freed_bytes_are_reused_from_offset_zero():
    #   offset
    #     40 +-----------+-----------+
    #        |           c           |   c: 10 bytes, steps [0, 4)
    #     30 +-----------+-----------+
    #        |     a     |           |   a: 30 bytes, steps [0, 2)
    #     20 |           +-----------+
    #        |           |     b     |   b: 20 bytes, steps [2, 4): a's bytes, leading gap
    #      0 +-----------+-----------+
    #        0           2           4  step
    # Peak: a + c = 40 at steps 0-1. Total 40, rounded up to one 256-byte row.
    lt = Lifetimes({"a": [("m", 0, 2)], "b": [("m", 2, 4)], "c": [("m", 0, 4)]})
    plan = ArenaPlan.packed({"a": 30, "b": 20, "c": 10}, lt, align_bytes=1)
    assert offsets(plan) == {"a": 0, "b": 0, "c": 30}
    assert plan.lower_bound_bytes == 40 and plan.total_bytes == 256
    assert plan.may_alias == {frozenset(("a", "b"))}
    plan.validate()


def test_buffers_of_different_modes_share_bytes():
    #   prefill (3 steps)            decode (2 steps)
    #   192 +---------+              192 +------+
    #       |    H    |                  |  H   |        H: 64, live in both modes
    #   128 +---------+              128 +------+
    #       |    P    |                  | free |        P: 128, prefill only
    #       |         |               96 +------+
    #       |         |                  |  D   |        D: 96, decode only
    #     0 +---------+                0 +------+
    # Lower bound max(64 + 128, 64 + 96) = 192; D takes P's bytes.
    lt = Lifetimes(
        {
            "H": [("prefill", 0, 3), ("decode", 0, 2)],
            "P": [("prefill", 0, 3)],
            "D": [("decode", 0, 2)],
        }
    )
    plan = ArenaPlan.packed({"H": 64, "P": 128, "D": 96}, lt, align_bytes=32)
    assert offsets(plan) == {"H": 128, "P": 0, "D": 0}
    assert plan.lower_bound_bytes == 192 and plan.total_bytes == 256
    plan.validate()


U = 256


def test_best_fit_takes_the_tightest_gap():
    #   offset/256
    #   100 +-----------+-----------+
    #       |           T           |   T: 10 rows, steps [0, 4)
    #    90 +-----------+-----------+
    #       |     B     |     X     |   B: 20, steps [0, 2); X: 20, steps [2, 4) fits B's
    #    70 +-----------+-----------+      gap exactly, rather than the looser gap of A
    #       |           K           |   K: 30, steps [0, 4)
    #    40 +-----------+-----------+
    #       |     A     |  (20 free)|   A: 40, steps [0, 2)
    #     0 +-----------+-----------+
    #       0           2           4  step
    # Peak 100 rows at steps 0-1; total 100 rows.
    lt = Lifetimes(
        {
            "A": [("m", 0, 2)],
            "K": [("m", 0, 4)],
            "B": [("m", 0, 2)],
            "T": [("m", 0, 4)],
            "X": [("m", 2, 4)],
        }
    )
    sizes = {"A": 40 * U, "K": 30 * U, "B": 20 * U, "T": 10 * U, "X": 20 * U}
    plan = ArenaPlan.packed(sizes, lt)
    assert offsets(plan) == {"A": 0, "K": 40 * U, "B": 70 * U, "T": 90 * U, "X": 70 * U}
    assert plan.total_bytes == plan.lower_bound_bytes == 100 * U
    plan.validate()


def test_best_offset_best_fit_and_first_fit():
    # X (20 rows) beside K at [40, 70) and T at [90, 100): offsets o with lo < o < hi are
    # forbidden. Gaps: [0, 20] (20 rows of slack), [70, 70] (none), [100, inf).
    forbidden = [(40 * U - 20 * U, 70 * U), (90 * U - 20 * U, 100 * U)]
    assert _best_offset(forbidden, U, "best") == 70 * U
    assert _best_offset(forbidden, U, "first") == 0
    # Alignment: the gap [1, 299] holds the aligned offset 256 only, and no 512-aligned one.
    assert _best_offset([(-10, 1), (300, 2048)], U, "first") == 256
    assert _best_offset([(-10, 1), (300, 2048)], 512, "first") == 2048


def test_guard_bands_are_never_covered():
    #   a: 100 bytes, step 0; b: 60 bytes, step 1; guard 16 after each.
    #   116 +------+------+
    #       |guard | guard|   one band, shared: b ends where a ends
    #   100 +------+------+
    #       |  a   |  b   |   b: [40, 100)
    #    40 |      +------+
    #       |      |      |
    #     0 +------+------+
    lt = Lifetimes({"a": [("m", 0, 1)], "b": [("m", 1, 2)]})
    sizes = {"a": 100, "b": 60}
    plan = ArenaPlan.packed(sizes, lt, align_bytes=4, guard_bytes=16)
    assert offsets(plan) == {"a": 0, "b": 40}
    assert plan.lower_bound_bytes == 116
    plan.validate()
    # Without guards b simply reuses a's first bytes.
    assert offsets(ArenaPlan.packed(sizes, lt, align_bytes=4)) == {"a": 0, "b": 0}
    # With 256-byte alignment the ends cannot line up, so the two cannot share.
    wide = ArenaPlan.packed(sizes, lt, guard_bytes=16)
    assert offsets(wide) == {"a": 0, "b": 256}

    # The guard bands survive allocate and writes into the shared bytes.
    arena = plan.allocate()
    assert plan.check_guards(arena) == []
    arena = plan.write(arena, "a", jnp.full((100,), 7, jnp.uint8))
    arena = plan.write(arena, "b", jnp.full((60,), 9, jnp.uint8))
    assert plan.check_guards(arena) == []
    assert np.all(np.asarray(plan.view(arena, "a", (100,), jnp.uint8))[40:] == 9)


# -- properties on random lifetimes ------------------------------------------------------------


@st.composite
def problems(draw):
    modes = draw(st.lists(st.sampled_from(["prefill", "decode", "verify"]), min_size=1,
                          max_size=3, unique=True))  # fmt: skip
    steps = {m: draw(st.integers(1, 10)) for m in modes}
    n = draw(st.integers(1, 12))
    sizes, live = {}, {}
    for i in range(n):
        name = f"b{i}"
        sizes[name] = draw(st.sampled_from([0, 1, 100, 256, 300, 1000, 4096, 5000]))
        if draw(st.integers(0, 5)) == 0:
            continue  # unknown: live always
        intervals = []
        for _ in range(draw(st.integers(0, 3))):
            m = draw(st.sampled_from(modes))
            start = draw(st.integers(0, steps[m] - 1))
            intervals.append((m, start, draw(st.integers(start + 1, steps[m]))))
        live[name] = intervals
    align = draw(st.sampled_from([1, 8, 256, 1024]))
    guard = draw(st.sampled_from([0, 0, 16]))
    return sizes, Lifetimes(live, num_steps=steps), align, guard


@settings(max_examples=60, deadline=None)
@given(problems())
def test_packed_plans_are_valid_bounded_and_deterministic(problem):
    sizes, lt, align, guard = problem
    plan = ArenaPlan.packed(sizes, lt, align_bytes=align, guard_bytes=guard)
    plan.validate()  # against its own lifetimes
    plan.validate(lt)
    seq = ArenaPlan.sequential(sizes, align_bytes=align, guard_bytes=guard)
    seq.validate(lt)  # sequential is a valid packing of any lifetimes
    lower = lt.lower_bound_bytes(sizes, align_bytes=align, guard_bytes=guard)
    assert plan.lower_bound_bytes == lower
    assert lower <= plan.total_bytes <= seq.total_bytes
    names = [n for n, b in sizes.items() if b]
    assert plan.may_alias == {
        frozenset((a, b)) for i, a in enumerate(names) for b in names[i + 1 :]
        if not lt.conflicts(a, b)
    }  # fmt: skip
    assert ArenaPlan.packed(sizes, lt, align_bytes=align, guard_bytes=guard) == plan


# -- validation --------------------------------------------------------------------------------


def test_validate_reports_every_violation_at_once():
    # Bytes:  a [0, 1024)  b [512, 1536)  c [1024, 2048)  e [1536, 2048)  d [0, 256)
    # a, b, c live at step 0; d never live; e not named (live always).
    lt = Lifetimes({"a": [("m", 0, 1)], "b": [("m", 0, 1)], "c": [("m", 0, 1)], "d": []})
    regions = tuple(
        Region(*t)
        for t in [("a", 0, 1024), ("b", 512, 1024), ("c", 1024, 1024), ("e", 1536, 512),
                  ("d", 0, 256)]
    )  # fmt: skip
    names = [r.name for r in regions]
    everything = frozenset(frozenset((x, y)) for x in names for y in names if x != y)
    plan = ArenaPlan(regions, 2048, 256, 0, everything)
    with pytest.raises(ArenaError) as err:
        plan.validate(lt)
    msg = str(err.value)
    assert "3 problems" in msg
    assert "'a' [0, 1024) and 'b' [512, 1536) share bytes [512, 1024)" in msg
    assert "'b' [512, 1536) and 'c' [1024, 2048) share bytes [1024, 1536)" in msg
    assert "'c' [1024, 2048) and 'e' [1536, 2048) share bytes [1536, 2048)" in msg
    assert "'d'" not in msg  # never live: may overlap anything
    # Without lifetimes every region is live always: d's overlap with a is a fourth problem.
    with pytest.raises(ArenaError, match="4 problems"):
        plan.validate()


def test_validate_reports_covered_guard_bands():
    lt = Lifetimes({"a": [("m", 0, 1)], "b": [("m", 1, 2)]})
    # b's bytes [0, 150) cover a's guard [100, 116); b's guard [150, 166) is clear.
    regions = (Region("a", 0, 100), Region("b", 0, 150))
    plan = ArenaPlan(regions, 256, 1, 16, frozenset({frozenset(("a", "b"))}))
    with pytest.raises(ArenaError, match=r"'b' \[0, 150\) covers the guard band \[100, 116\)"):
        plan.validate(lt)


def test_validate_and_packed_refuse_bad_arguments():
    sizes = {"a": 10}
    with pytest.raises(ArenaError, match="must be a Lifetimes"):
        ArenaPlan.packed(sizes, {"a": [("m", 0, 1)]})
    lt = Lifetimes({"a": [("m", 0, 1)]})
    with pytest.raises(ArenaError, match="power of two"):
        ArenaPlan.packed(sizes, lt, align_bytes=3)
    with pytest.raises(ArenaError, match="guard_bytes"):
        ArenaPlan.packed(sizes, lt, guard_bytes=-1)
    with pytest.raises(ArenaError, match="must be a Lifetimes"):
        ArenaPlan.sequential(sizes).validate({"a": 1})


def test_sequential_plans_validate_and_bound_themselves():
    sizes = {"a": 1000, "b": 0, "c": 300}
    seq = ArenaPlan.sequential(sizes)
    seq.validate()
    assert seq.lifetimes is None
    assert seq.lower_bound_bytes == 1024 + 512 == seq.total_bytes


def test_buffers_without_lifetimes_never_share():
    lt = Lifetimes({"a": [("m", 0, 1)], "b": [("m", 1, 2)]})
    plan = ArenaPlan.packed({"a": 512, "b": 512, "x": 256}, lt)
    assert offsets(plan)["a"] == offsets(plan)["b"]
    x = plan.regions["x"]
    assert all(
        x.end_bytes <= r.offset_bytes or r.end_bytes <= x.offset_bytes
        for r in plan.region_list
        if r.name != "x"
    )


# -- the presets -------------------------------------------------------------------------------


@pytest.mark.parametrize("limits", LIMITS, ids=["8k-256k", "2k-128k"])
def test_presets_pack_within_five_percent_of_the_lower_bound(limits):
    for name in jaxarena.presets():
        cfg = ModelConfig.preset(name)
        sizes = BufferSizes.from_config(cfg, *limits, levers=Levers(), target=GB10)
        lt = Lifetimes.standard(cfg)
        plan = ArenaPlan.packed(sizes, lt)
        plan.validate()
        seq = ArenaPlan.sequential(sizes)
        assert plan.lower_bound_bytes <= plan.total_bytes <= 1.05 * plan.lower_bound_bytes, name
        assert plan.total_bytes < seq.total_bytes, name


def test_planning_fifty_buffers_takes_under_a_second():
    cfg = ModelConfig.preset("qwen3.8-flash-next-fixture")
    sizes = BufferSizes.from_config(cfg, *LIMITS[0], levers=Levers(), target=GB10)
    lt = Lifetimes.standard(cfg)
    t0 = time.perf_counter()
    ArenaPlan.packed(sizes, lt)
    assert time.perf_counter() - t0 < 1.0


def test_packing_report():
    cfg = ModelConfig.preset("qwen3-8b")
    sizes = BufferSizes.from_config(cfg, *LIMITS[1], levers=Levers(), target=GB10)
    lt = Lifetimes.standard(cfg)
    report = packing_report(sizes, lt)
    plan = ArenaPlan.packed(sizes, lt)
    assert report["sequential_bytes"] == ArenaPlan.sequential(sizes).total_bytes
    assert report["packed_bytes"] == plan.total_bytes
    assert report["lower_bound_bytes"] == plan.lower_bound_bytes
    mode, step, label = report["peak"]
    assert label == lt.label(mode, step)
    assert [r["name"] for r in report["regions"]] == list(plan.regions)
    for r in report["regions"]:
        region = plan.regions[r["name"]]
        assert (r["offset_bytes"], r["nbytes"]) == (region.offset_bytes, region.nbytes)
        assert r["live"] == [list(i) for i in lt.intervals(r["name"])]
    # Buffers the lifetimes do not name are reported live at every step of every mode.
    other = packing_report({**sizes.as_dict(), "extra": 256}, lt)["regions"][-1]
    assert other["name"] == "extra"
    assert other["live"] == [[m, 0, lt.num_steps[m]] for m in lt.modes]


# -- running a step ----------------------------------------------------------------------------

STEP_SIZES = {"x": 1024, "h": 1024, "tmp": 2048, "out": 1024, "keep": 512}


def _step(plan, arena):
    x = plan.view(arena, "x", (256,), jnp.float32)
    arena = plan.write(arena, "h", jnp.sin(x) * 2)
    h = plan.view(arena, "h", (256,), jnp.float32)
    arena = plan.write(arena, "tmp", jnp.stack([h + 1, h * h]))
    t = plan.view(arena, "tmp", (2, 256), jnp.float32)
    return plan.write(arena, "out", t[0] * t[1] + plan.view(arena, "keep", (128,), jnp.float32)[0])


def test_a_packed_arena_runs_a_recorded_step_bit_identically():
    seq = ArenaPlan.sequential(STEP_SIZES)
    # "keep" is an input the caller reads again afterwards: live_out keeps it to the end.
    step = functools.partial(_step, seq)
    lt = record_lifetimes(step, seq.allocate(), mode="decode", live_out=["keep"])
    packed = ArenaPlan.packed(STEP_SIZES, lt)
    assert packed.total_bytes < seq.total_bytes
    packed.validate()
    x = jnp.linspace(-3, 3, 256, dtype=jnp.float32)
    keep = jnp.arange(128, dtype=jnp.float32) + 0.5
    outs = []
    for plan in (seq, packed):
        arena = plan.write(plan.write(plan.allocate(), "x", x), "keep", keep)
        arena = jax.jit(functools.partial(_step, plan), donate_argnums=0)(arena)
        outs.append(np.asarray(plan.view(arena, "out", (256,), jnp.float32)))
        assert np.array_equal(np.asarray(plan.view(arena, "keep", (128,), jnp.float32)), keep)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_drop_unnamed_leaves_out_the_buffers_no_step_uses():
    """`drop_unnamed=True`: only the named buffers get regions (packed as usual); a step
    touching a dropped one fails at trace time; the flag must be a bool."""
    sizes = {"a": 1000, "b": 600, "unused": 5000}
    lt = Lifetimes({"a": [("m", 0, 1)], "b": [("m", 1, 2)]})
    kept = ArenaPlan.packed(sizes, lt, align_bytes=4)
    plan = ArenaPlan.packed(sizes, lt, align_bytes=4, drop_unnamed=True)
    assert set(kept.regions) == {"a", "b", "unused"}
    assert set(plan.regions) == {"a", "b"}
    assert (
        plan.total_bytes == ArenaPlan.packed({"a": 1000, "b": 600}, lt, align_bytes=4).total_bytes
    )
    assert plan.total_bytes < ArenaPlan.sequential({"a": 1000, "b": 600}, align_bytes=4).total_bytes
    with pytest.raises(ArenaError, match="no region named 'unused'"):
        plan.view(plan.allocate(), "unused", (4,), jnp.uint8)
    with pytest.raises(ArenaError, match="drop_unnamed"):
        ArenaPlan.packed(sizes, lt, drop_unnamed=1)


def test_check_fits_is_recorded_as_a_view_then_a_write():
    """A kernel's `_into` form touches its regions through the aliased arena, not through
    `view`/`write`; its `check_fits` call is what `record_lifetimes` hears, so the region
    is named and lives up to its last view (or to the end when none follows)."""
    plan = ArenaPlan.sequential({"scratch": 256, "out": 256, "other": 256})

    def step(arena):
        plan.check_fits(("scratch", (64,), jnp.float32), ("out", (64,), jnp.float32))
        y = plan.view(arena, "out", (64,), jnp.float32)
        return plan.write(arena, "other", y)

    lt = record_lifetimes(step, jax.ShapeDtypeStruct(plan.arena_shape, jnp.uint8), mode="m")
    assert {"scratch", "out", "other"} <= set(lt.live)
    # Events: view/write scratch (0, 1), view/write out (2, 3), view out (4), write other (5).
    # A view with no write before it counts as an input (live from step 0): the kernel may
    # read what the region held, so the recording stays conservative.
    assert lt.intervals("out") == (("m", 0, 5),)
    assert lt.intervals("scratch") == (("m", 0, 6),)
