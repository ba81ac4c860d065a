"""ArenaPlan: layout, views and writes, donation in place, guards, footprints, sharding."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxarena import ArenaError, ArenaPlan, BufferSizes, GuardError, Levers, ModelConfig, Target
from jaxarena._arena.bytes import ROW_BYTES
from jaxarena.testing import (
    assert_footprint,
    assert_traced_at_most,
    count_traces,
    memory_footprint,
)

SMALL = {"a": 1000, "empty": 0, "b": 300, "c": 4096, "d": 17}


def test_sequential_layout_by_hand():
    p = ArenaPlan.sequential(SMALL, align_bytes=256, guard_bytes=32)
    got = {n: (r.offset_bytes, r.nbytes) for n, r in p.regions.items()}
    # a: [0, 1000) + guard 32 -> next at round_up(1032, 256) = 1280; b: [1280, 1580) + 32 ->
    # 1792; c: [1792, 5888) + 32 -> 6144; d: [6144, 6161) + 32 -> 6400 total (25 rows).
    assert got == {"a": (0, 1000), "b": (1280, 300), "c": (1792, 4096), "d": (6144, 17)}
    assert p.total_bytes == 6400
    assert p.arena_shape == (25, ROW_BYTES)
    assert "empty" not in p.regions


def test_sequential_alignment_and_no_overlap_property():
    rng = np.random.default_rng(0)
    for align in (1, 8, 64, 256, 4096):
        sizes = {f"r{i}": int(n) for i, n in enumerate(rng.integers(0, 5000, 30))}
        p = ArenaPlan.sequential(sizes, align_bytes=align, guard_bytes=int(rng.integers(0, 40)))
        spans = sorted((r.offset_bytes, r.end_bytes + p.guard_bytes) for r in p.regions.values())
        assert all(o % align == 0 for o, _ in spans)
        assert all(
            a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False)
        )
        assert spans[-1][1] <= p.total_bytes
        assert {n for n, v in sizes.items() if v} == set(p.regions)


def test_plan_from_buffer_sizes_keeps_seed_order_and_skips_zero():
    cfg = ModelConfig.preset("qwen3-8b")
    sizes = BufferSizes.from_config(
        cfg, 64, 4096, 16, 8, levers=Levers(), target=Target.preset("gb10")
    )
    p = ArenaPlan.sequential(sizes)
    nonzero = [k for k, v in sizes.as_dict().items() if v]
    assert list(p.regions) == nonzero
    assert p.total_bytes >= sizes.total_bytes()
    assert hash(p) == hash(ArenaPlan.sequential(sizes)) and p == ArenaPlan.sequential(sizes)
    assert "total:" in p.describe() and "hidden_states" in p.describe()


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(align_bytes=3), "align_bytes=3"),
        (dict(align_bytes=0), "align_bytes=0"),
        (dict(guard_bytes=-1), "guard_bytes=-1"),
    ],
)
def test_bad_plan_arguments(kwargs, needle):
    with pytest.raises(ArenaError, match=needle):
        ArenaPlan.sequential(SMALL, **kwargs)


def test_bad_sizes_listed_together():
    with pytest.raises(ArenaError) as e:
        ArenaPlan.sequential({"x": -1, "y": 2.5, "": 3})
    msg = str(e.value)
    assert "x=-1" in msg and "y=2.5" in msg and "non-empty" in msg


def test_hand_built_overlap_reports_every_pair():
    from jaxarena import Region

    regions = (Region("a", 0, 512), Region("b", 256, 512), Region("c", 512, 256))
    with pytest.raises(ArenaError) as e:
        ArenaPlan(regions, 1024)
    assert "'a'" in str(e.value) and "'b'" in str(e.value) and str(e.value).count("overlap") == 2


DTYPES = [
    jnp.float32, jnp.bfloat16, jnp.float16, jnp.int8, jnp.uint8, jnp.int32, jnp.uint32,
    jnp.float8_e4m3fn, jnp.float8_e5m2, jnp.bool_,
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("shape", [(1,), (3, 5), (64,), (2, 128)])
def test_write_then_view_round_trips(dtype, shape):
    p = ArenaPlan.sequential({"pad": 100, "x": 1024, "y": 1024}, align_bytes=64)
    rng = np.random.default_rng(1)
    raw = rng.integers(0, 256, size=np.prod(shape) * jnp.dtype(dtype).itemsize, dtype=np.uint8)
    if jnp.dtype(dtype) == jnp.bool_:
        value = raw.reshape(shape) % 2 == 1
    else:
        value = raw.view(jnp.dtype(dtype)).reshape(shape)
    arena = p.allocate()
    before_y = np.asarray(p.view(arena, "y", (1024,), jnp.uint8))

    @jax.jit
    def step(a, v):
        a = p.write(a, "x", v)
        return a, p.view(a, "x", shape, dtype)

    arena, back = step(arena, jnp.asarray(value))
    np.testing.assert_array_equal(np.asarray(back).view(np.uint8), np.asarray(value).view(np.uint8))
    np.testing.assert_array_equal(np.asarray(p.view(arena, "y", (1024,), jnp.uint8)), before_y)


def test_write_keeps_rest_of_region_and_neighbours():
    p = ArenaPlan.sequential({"x": 1000, "y": 700}, align_bytes=8)  # y starts mid-row
    arena = p.write(p.allocate(), "y", jnp.full((700,), 9, jnp.uint8))
    arena = p.write(arena, "x", jnp.full((1000,), 7, jnp.uint8))
    arena = p.write(arena, "y", jnp.arange(10, dtype=jnp.uint8))
    y = np.asarray(p.view(arena, "y", (700,), jnp.uint8))
    assert list(y[:10]) == list(range(10)) and (y[10:] == 9).all()
    assert (np.asarray(p.view(arena, "x", (1000,), jnp.uint8)) == 7).all()


def test_view_errors_at_trace_time():
    p = ArenaPlan.sequential({"x": 1024, "z": 0})
    arena = p.allocate()
    with pytest.raises(ArenaError, match="needs 1028 bytes but the region holds 1024"):
        p.view(arena, "x", (257,), jnp.float32)
    with pytest.raises(ArenaError, match="no region named 'z'"):
        p.view(arena, "z", (1,), jnp.float32)
    with pytest.raises(ArenaError, match="no region named 'nope'"):
        p.write(arena, "nope", jnp.zeros(1))
    with pytest.raises(ArenaError, match="needs 1032 bytes"):
        p.write(arena, "x", jnp.zeros(258, jnp.float32))
    with pytest.raises(ArenaError, match="expected uint8"):
        p.view(jnp.zeros((3, 3), jnp.uint8), "x", (1,), jnp.float32)

    @jax.jit
    def dynamic(a, n):
        return p.view(a, "x", (n,), jnp.float32)

    with pytest.raises(ArenaError, match="must be static ints"):
        dynamic(arena, 4)


def test_donated_step_is_in_place_aliased_and_compiled_once():
    p = ArenaPlan.sequential({"h": 64 * 128 * 4, "acc": 128 * 4})

    def step(arena, x):
        h = p.view(arena, "h", (64, 128), jnp.float32)
        h = h * 0.5 + x
        arena = p.write(arena, "h", h)
        acc = p.view(arena, "acc", (128,), jnp.float32) + h.sum(0)
        return p.write(arena, "acc", acc), acc[0]

    counter = count_traces(step)
    jitted = jax.jit(counter, donate_argnums=0)
    arena = p.allocate()
    ptr = arena.unsafe_buffer_pointer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a "donated buffers were not usable" warning fails
        for i in range(20):
            arena, first = jitted(arena, jnp.full((64, 128), float(i)))
            assert arena.unsafe_buffer_pointer() == ptr
    assert_traced_at_most(counter, 1)
    text = jitted.lower(arena, jnp.ones((64, 128))).compile().as_text()
    assert "input_output_alias" in text
    # h_i = h_{i-1}/2 + i, from 0: the closed form checks the arena really carried state.
    h = 0.0
    acc = 0.0
    for i in range(20):
        h = h * 0.5 + i
        acc += 64 * h
    assert float(first) == pytest.approx(acc, rel=1e-6)
    fp = assert_footprint(jitted, arena, jnp.ones((64, 128)), min_alias_bytes=p.total_bytes)
    assert fp.alias_bytes >= p.total_bytes


def test_footprint_assertion_message_is_a_table():
    p = ArenaPlan.sequential({"h": 4096})
    jitted = jax.jit(lambda a: p.write(a, "h", p.view(a, "h", (1024,), jnp.float32) + 1))
    with pytest.raises(AssertionError) as e:
        assert_footprint(jitted, p.allocate(), min_alias_bytes=1)  # not donated: no alias
    msg = str(e.value)
    assert "alias_bytes" in msg and "FAILED" in msg and "temp_bytes" in msg
    with pytest.raises(ValueError, match="at least one bound"):
        assert_footprint(jitted, p.allocate())


def test_footprint_without_analysis_fails(monkeypatch):
    import jax._src.stages as stages

    monkeypatch.setattr(stages.Compiled, "memory_analysis", lambda self: None)
    with pytest.raises(AssertionError, match="no memory analysis"):
        assert_footprint(jax.jit(lambda x: x + 1), jnp.ones(4), max_temp_bytes=10)


def test_traced_at_most_catches_retrace():
    counter = count_traces(lambda x: x * 2)
    f = jax.jit(counter)
    f(jnp.ones(3))
    f(jnp.ones(4))
    with pytest.raises(AssertionError, match="traced 2 times"):
        assert_traced_at_most(counter, 1)


def test_guard_names_the_overrunning_region():
    p = ArenaPlan.sequential({"a": 16 * 64, "b": 16 * 64, "c": 512}, guard_bytes=64)
    arena = p.allocate()
    assert p.check_guards(arena) == []
    rows_of_b = 16  # b holds 16 rows of 64 bytes; the buggy kernel writes ceil16(17) = 32 rows

    @jax.jit
    def buggy(a):
        # Writes one row (64 bytes) past region "b" by going below the plan's checks, as a
        # kernel with a wrong row count would.
        r = p.regions["b"]
        rows = jnp.full((rows_of_b + 1, 64), 3, jnp.uint8)
        flat = a.reshape(-1)
        flat = jax.lax.dynamic_update_slice(flat, rows.reshape(-1), (r.offset_bytes,))
        return flat.reshape(a.shape)

    arena = buggy(arena)
    assert p.check_guards(arena) == ["b"]
    with pytest.raises(GuardError, match="b"):
        p.check_guards(arena, strict=True)


def test_arena_beyond_2_gib_written_and_read_back():
    """An arena larger than 2^31 bytes; a region starting beyond 2^31 is written and read in a
    jitted, donated step."""
    big = 2**31 + 4096
    p = ArenaPlan.sequential({"big": big, "tail": 8200, "mid_row": 300}, align_bytes=64)
    assert p.regions["tail"].offset_bytes > 2**31
    assert p.regions["mid_row"].offset_bytes % ROW_BYTES != 0
    arena = p.allocate()
    ptr = arena.unsafe_buffer_pointer()

    @jax.jit
    def step(a, x):
        a = p.write(a, "tail", x)
        a = p.write(a, "mid_row", x[:75])
        return a, p.view(a, "tail", (2048,), jnp.float32), p.view(a, "mid_row", (75,), jnp.float32)

    step = jax.jit(step, donate_argnums=0)
    x = jnp.arange(2048, dtype=jnp.float32) - 1000.5
    arena, tail, mid = step(arena, x)
    np.testing.assert_array_equal(np.asarray(tail), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(mid), np.asarray(x[:75]))
    assert arena.unsafe_buffer_pointer() == ptr
    # The bytes really sit beyond 2^31 in the array (not just round-tripped through a view).
    row = p.regions["tail"].offset_bytes // ROW_BYTES
    got = np.asarray(arena[row : row + 1]).view(np.float32)[0]
    np.testing.assert_array_equal(got, np.asarray(x[: ROW_BYTES // 4]))
    del arena


def test_allocate_on_device_and_errors():
    p = ArenaPlan.sequential({"a": 100})
    dev = jax.devices()[-1]
    arena = p.allocate(device=dev)
    assert arena.devices() == {dev}
    assert not np.asarray(arena).any()
    with pytest.raises(ArenaError, match="not both"):
        p.allocate(device=dev, sharding=object())
    with pytest.raises(ArenaError, match="NamedSharding"):
        p.allocate(sharding=jax.sharding.SingleDeviceSharding(dev))


def test_sharded_arena_one_per_device_in_place():
    devices = jax.devices()
    assert len(devices) == 8, "conftest sets 8 host devices"
    mesh = jax.sharding.Mesh(np.array(devices), ("d",))
    p = ArenaPlan.sequential({"x": 8 * 4, "acc": 8 * 4}, guard_bytes=32)
    sharding = p.sharding(mesh)
    arena = p.allocate(sharding=sharding)
    assert arena.shape == (8 * p.arena_shape[0], ROW_BYTES)
    assert [s.data.shape for s in arena.addressable_shards] == [p.arena_shape] * 8
    assert p.check_guards(arena) == []
    P = jax.sharding.PartitionSpec

    def local_step(a, x):
        acc = p.view(a, "acc", (8,), jnp.float32) + x[0]
        a = p.write(a, "x", x[0])
        return p.write(a, "acc", acc), acc[None]

    step = jax.jit(
        jax.shard_map(local_step, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=(P("d"), P("d"))),
        donate_argnums=0,
    )
    ptrs = [s.data.unsafe_buffer_pointer() for s in arena.addressable_shards]
    x = jnp.arange(64, dtype=jnp.float32).reshape(8, 8)
    x = jax.device_put(x, jax.sharding.NamedSharding(mesh, P("d")))
    for _ in range(3):
        arena, acc = step(arena, x)
    assert [s.data.unsafe_buffer_pointer() for s in arena.addressable_shards] == ptrs
    np.testing.assert_array_equal(
        np.asarray(acc), 3 * np.arange(64, dtype=np.float32).reshape(8, 8)
    )
    for i, shard in enumerate(arena.addressable_shards):
        local = np.asarray(shard.data)
        np.testing.assert_array_equal(local.reshape(-1)[:32].view(np.float32), np.arange(8) + 8 * i)
    assert p.check_guards(arena) == []
    # Break the guard after "acc" on device 3 only: the sharded check names it.
    shards = [np.array(s.data) for s in arena.addressable_shards]
    end = p.regions["acc"].end_bytes
    shards[3].reshape(-1)[end] ^= 0xFF
    broken = jax.make_array_from_single_device_arrays(
        arena.shape, arena.sharding,
        [jax.device_put(a, s.device) for a, s in zip(shards, arena.addressable_shards, strict=True)],
    )  # fmt: skip
    assert p.check_guards(broken) == ["acc"]


def test_partial_row_writes_stay_in_place():
    """Writes that end (or start) mid-row must not read the arena back: a read-modify-write
    of the partial rows next to the in-place update makes XLA copy the whole arena."""
    p = ArenaPlan.sequential({"big": 1 << 20, "s1": 100, "s2": 36, "s3": 1000}, align_bytes=4)
    assert any(r.offset_bytes % ROW_BYTES for r in p.regions.values())

    def step(a, x):
        a = p.write(a, "s1", x[:25])
        a = p.write(a, "s2", x[25:34])
        a = p.write(a, "s3", x[:250])
        return a, p.view(a, "s2", (9,), jnp.float32)

    jitted = jax.jit(step, donate_argnums=0)
    arena = p.allocate()
    x = jnp.arange(250, dtype=jnp.float32)
    assert_footprint(jitted, arena, x, min_alias_bytes=p.total_bytes, max_temp_bytes=64 * 1024)
    arena, s2 = jitted(arena, x)
    np.testing.assert_array_equal(np.asarray(s2), np.arange(25, 34))
    np.testing.assert_array_equal(np.asarray(p.view(arena, "s1", (25,), jnp.float32)),
                                  np.arange(25))  # fmt: skip


def test_stale_view_costs_a_whole_copy():
    """The documented pitfall, measured: a view of an old arena version consumed after a later
    write makes XLA copy the arena (temp >= arena size); reading again from the newest arena
    keeps the step copy-free."""
    p = ArenaPlan.sequential({"h": 1 << 20, "n": 1 << 20})

    def stale(a):
        h = p.view(a, "h", (1 << 18,), jnp.float32)
        a = p.write(a, "n", h * 2)
        a = p.write(a, "h", jnp.ones_like(h))
        return p.write(a, "n", p.view(a, "n", h.shape, h.dtype) + h)  # h is from version 0

    def fresh(a):
        h = p.view(a, "h", (1 << 18,), jnp.float32)
        a = p.write(a, "n", h * 3)
        return p.write(a, "h", jnp.ones_like(h))

    arena = p.allocate()
    bad = memory_footprint(jax.jit(stale, donate_argnums=0), arena)
    good = memory_footprint(jax.jit(fresh, donate_argnums=0), arena)
    assert bad.temp_bytes >= p.total_bytes
    assert good.temp_bytes <= p.regions["n"].nbytes  # at most the value being written
