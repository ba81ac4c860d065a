"""Issue 17, the arena's side: sizes no device can hold, 64-bit dtypes without x64, wrong
argument types, and `record_lifetimes` under threads. Each test failed on the code before the
fix (an abort, a JAX-internal error, an `AttributeError`, or a silently wrong result)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxarena import (
    ArenaError,
    ArenaPlan,
    BufferSizes,
    Levers,
    Lifetimes,
    ModelConfig,
    Region,
    Target,
    record_lifetimes,
)
from jaxarena._arena.bytes import ROW_BYTES
from jaxarena._arena.device import check_allocatable


def _run(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter: an abort there fails the test instead of the run."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


# -- defect 1: sizes checked before allocating -----------------------------------------------


def test_allocate_refuses_sizes_past_int64_and_int32_rows_in_a_subprocess():
    # Before the fix the first allocate aborted the interpreter (exit 134, no exception).
    r = _run(
        """
        from jaxarena import ArenaError, ArenaPlan, BufferSizes, Levers, ModelConfig, Target
        cfg = ModelConfig.preset("qwen3-8b")
        sizes = BufferSizes.from_config(cfg, 2**46, 32768, 16, 64, levers=Levers(),
                                        target=Target.preset("gb10"))
        for plan in (ArenaPlan.sequential(sizes), ArenaPlan.sequential({"a": 2**63})):
            assert plan.total_bytes >= 2**63, plan.total_bytes
            try:
                plan.allocate()
            except ArenaError as e:
                assert "512.00 GiB" in str(e), e
            else:
                raise SystemExit("allocated")
        print("ok")
        """
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


def test_allocate_bound_is_the_int32_row_index():
    # 2^31 rows of 256 bytes (512 GiB) is the largest arena whose row indices fit int32; one
    # row more is refused before anything is allocated.
    plan = ArenaPlan((Region("a", 0, 256),), (1 << 31) * ROW_BYTES + ROW_BYTES)
    with pytest.raises(ArenaError, match="int32"):
        plan.allocate()


class _Device:
    """A stand-in device reporting `bytes_limit` as GPUs do."""

    def __init__(self, limit):
        self.limit = limit

    def memory_stats(self):
        return {"bytes_limit": self.limit, "bytes_in_use": 0}

    def __str__(self):
        return "fake:0"


def test_allocate_checks_the_devices_reported_memory():
    plan = ArenaPlan.sequential({"a": 10 * ROW_BYTES})
    check_allocatable(plan, [_Device(plan.total_bytes)])  # exactly fits
    with pytest.raises(ArenaError, match="fake:0 reports 2,559 bytes"):
        check_allocatable(plan, [_Device(plan.total_bytes - 1)])


def test_allocate_device_must_be_a_jax_device():
    plan = ArenaPlan.sequential({"a": 64})
    with pytest.raises(ArenaError, match=r"device='cpu:0' must be a jax.Device"):
        plan.allocate(device="cpu:0")
    assert plan.allocate(device=jax.devices()[0]).shape == plan.arena_shape


# -- defect 6: 64-bit dtypes without x64 ----------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "int64", "uint64", None])
def test_64bit_views_and_writes_without_x64_name_the_dtype(dtype):
    assert not jax.config.jax_enable_x64
    plan = ArenaPlan.sequential({"a": 64})
    arena = plan.allocate()
    shown = "float64" if dtype is None else dtype
    with pytest.raises(ArenaError, match=rf"{shown}\)? is 64-bit but jax_enable_x64 is off"):
        plan.view(arena, "a", (2,), dtype)
    with pytest.raises(ArenaError, match=f"{shown} is 64-bit"):
        plan.write(arena, "a", np.zeros(2, shown))
    with pytest.raises(ArenaError, match=f"{shown} is 64-bit"):
        plan.check_fits(("a", (2,), shown))
    # 32-bit views of the same bytes keep working.
    assert plan.view(plan.write(arena, "a", jnp.ones(2)), "a", (2,), jnp.float32).tolist() == [
        1.0,
        1.0,
    ]


# -- defect 10: wrong argument types and shapes ---------------------------------------------


@pytest.mark.parametrize(
    ("regions", "total", "needle"),
    [
        ((), -256, "total_bytes=-256 must be an int >= 256"),
        ((), 256.0, "total_bytes=256.0 must be an int"),
        ((Region("a", 0.0, 16),), 256, "offset_bytes=0.0 must be an int >= 0"),
        ((Region("a", 0, 16.5),), 256, "nbytes=16.5 must be an int >= 0"),
        ((Region("a", -256, 16),), 256, "offset_bytes=-256 must be an int >= 0"),
        ((Region(3, 0, 16),), 256, "region name 3 must be a non-empty str"),
        (("a",), 256, "entry 'a' is not a Region"),
    ],
)
def test_arenaplan_refuses_negative_totals_and_non_int_offsets(regions, total, needle):
    with pytest.raises(ArenaError, match=needle):
        ArenaPlan(regions, total)


def test_check_guards_names_a_wrong_arena_plainly():
    plan = ArenaPlan.sequential({"a": 64, "b": 32}, guard_bytes=16)
    bad = [
        jnp.zeros((3, ROW_BYTES), jnp.uint8),  # a different plan's arena
        np.zeros((3, ROW_BYTES), np.uint8),  # numpy, wrong shape (was AttributeError)
        jnp.zeros(plan.arena_shape, jnp.int8),  # wrong dtype
        "arena",
    ]
    for arena in bad:
        with pytest.raises(ArenaError, match="check_guards: arena is .* expected this plan's"):
            plan.check_guards(arena)
    # A host copy of the right shape is checked like the device array.
    arena = plan.allocate()
    assert plan.check_guards(np.asarray(arena)) == []
    broken = np.asarray(arena).copy()
    broken.reshape(-1)[plan.regions["b"].end_bytes] ^= 1
    assert plan.check_guards(broken) == ["b"]


# -- defect 5: record_lifetimes under threads ----------------------------------------------


def test_record_lifetimes_concurrent_recordings_do_not_mix():
    # Two plans whose steps touch disjoint regions: every recording must see only its own.
    plans = {k: ArenaPlan.sequential({f"{k}{i}": 256 for i in range(4)}) for k in "xy"}

    def step(plan, arena):
        names = list(plan.regions)
        for src, dst in zip(names, names[1:], strict=False):
            arena = plan.write(arena, dst, plan.view(arena, src, (64,), jnp.float32) + 1)
        return arena

    def record(k):
        plan = plans[k]
        arena = jax.ShapeDtypeStruct(plan.arena_shape, jnp.uint8)
        return record_lifetimes(lambda a: step(plan, a), arena)

    expected = {k: record(k) for k in "xy"}
    results: list[tuple[str, object]] = []
    barrier = threading.Barrier(8)

    def worker(k):
        barrier.wait()
        for _ in range(3):
            results.append((k, record(k)))

    threads = [threading.Thread(target=worker, args=("xy"[i % 2],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 24
    for k, lt in results:
        assert lt == expected[k], (k, lt)


# -- sizing arguments of the wrong type (defect 10) ----------------------------------------


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"target": "hopper"}, "target must be a Target"),
        ({"levers": {"fp8_rowwise": True}}, "levers must be a Levers"),
    ],
)
def test_from_config_names_a_mistyped_target_or_levers(kw, needle):
    cfg = ModelConfig.preset("tiny-hybrid")
    kw = {"levers": Levers(), "target": Target.preset("gb10"), **kw}
    with pytest.raises(ValueError, match=needle):
        BufferSizes.from_config(cfg, 64, 128, 16, 4, **kw)


# -- issue 30: numpy integers are integers everywhere in the plan API -----------------------------


@pytest.mark.parametrize("np_int", [np.int64, np.uint32, np.int16])
def test_numpy_integer_arguments_give_the_same_plan(np_int):
    # Before: sequential said "align_bytes=256 must be a power of two" for np.int64(256) and
    # "guard_bytes=64 must be an int >= 0" for np.int64(64), while packed took both.
    sizes = {"a": 1000, "b": 24, "c": 300}
    lt = Lifetimes({"a": [("m", 0, 1)], "b": [("m", 1, 2)], "c": [("m", 0, 2)]})
    for build, args in ((ArenaPlan.sequential, ()), (ArenaPlan.packed, (lt,))):
        plain = build(sizes, *args, align_bytes=256, guard_bytes=64)
        numpy = build(sizes, *args, align_bytes=np_int(256), guard_bytes=np_int(64))
        assert numpy == plain
        assert type(numpy.align_bytes) is int and type(numpy.guard_bytes) is int
        assert all(type(r.offset_bytes) is int for r in numpy.region_list)
    assert lt.lower_bound_bytes(sizes, align_bytes=np_int(256), guard_bytes=np_int(64)) == (
        lt.lower_bound_bytes(sizes, align_bytes=256, guard_bytes=64)
    )
    direct = ArenaPlan((Region("a", np_int(0), np_int(16)),), np_int(256), np_int(256))
    assert direct == ArenaPlan((Region("a", 0, 16),), 256, 256)
    assert type(direct.total_bytes) is int and type(direct.region_list[0].nbytes) is int


def test_non_integers_are_still_refused_by_name():
    with pytest.raises(ArenaError, match="align_bytes=True must be a power of two"):
        ArenaPlan.sequential({"a": 1}, align_bytes=True)
    with pytest.raises(ArenaError, match="guard_bytes=1.0 must be an int >= 0"):
        ArenaPlan.sequential({"a": 1}, guard_bytes=1.0)
    with pytest.raises(ArenaError, match="guard_bytes=-1 must be an int >= 0"):
        ArenaPlan.sequential({"a": 1}, guard_bytes=np.int64(-1))
