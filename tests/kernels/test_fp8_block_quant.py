"""FP8 block-scaled activation quantization: kernel vs reference, error bound, arena form.

Interpret mode on CPU: every case is small (a few grid steps). The kernel must match the
plain-jnp reference bit for bit (q's e4m3 bits and the scales' f32 bits); a third, numpy
model with ml_dtypes' round-to-nearest-even cast checks the reference itself.
"""

from __future__ import annotations

import functools
import importlib
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _helpers.arena import random_arena
from _helpers.jitted import fp8_quant_ref
from _helpers.lowering import cuda_lowering_text
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxarena import ArenaPlan, BufferSizes, Levers, ModelConfig, Target
from jaxarena.testing import assert_footprint
from pallas_kernels.fp8_block_quant import (
    fp8_block_quant,
    fp8_block_quant_into,
    fp8_block_quant_reference,
)

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
FORMATS = ("f32", "ue8m0")


def _bits(a) -> np.ndarray:
    """The raw bits of an array (uint8 for 1-byte dtypes, uint32 for 4-byte ones)."""
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _assert_bits_equal(got, want, what: str) -> None:
    got_bits, want_bits = _bits(got), _bits(want)
    assert got_bits.shape == want_bits.shape, (what, got_bits.shape, want_bits.shape)
    bad = np.argwhere(got_bits != want_bits)
    assert bad.size == 0, (
        f"{what}: {len(bad)} of {got_bits.size} differ; first at {tuple(bad[0])}: "
        f"got {np.asarray(got)[tuple(bad[0])]!r}, want {np.asarray(want)[tuple(bad[0])]!r}"
    )


def _activations(rng: np.random.Generator, m: int, k: int, dtype, block_size: int = 128):
    """Activations that reach every path: a wide dynamic range between rows and blocks (so
    small values of a block fall in e4m3's subnormal range), an all-zero block, a block with
    one huge value among small ones, and f32-subnormal inputs."""
    finfo = jnp.finfo(dtype)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-12, 12, (m, 1)))
    x *= np.exp2(rng.integers(-6, 6, (1, k)))  # per-column spread: e4m3 subnormals in a block
    if m > 1:
        x[1, :block_size] = 0.0  # an all-zero block (the floor scale)
    if m > 2 and k > 1:
        x[2, : min(k, block_size)] *= 1e-3
        x[2, min(k, block_size) // 2] = float(finfo.max) * 0.75  # one huge value
    if m > 3 and dtype == jnp.float32:
        x[3, :] = rng.standard_normal(k) * 1e-40  # f32 subnormals
    return jnp.asarray(np.clip(x, -float(finfo.max), float(finfo.max)).astype(np.float32), dtype)


def _numpy_model(x: np.ndarray, block_size: int, scale_format: str):
    """Third implementation (numpy, IEEE f32, ml_dtypes RNE cast) of the documented formula."""
    x = np.asarray(x, np.float32)
    m, k = x.shape
    nb = -(-k // block_size)
    xb = np.zeros((m, nb * block_size), np.float32)
    xb[:, :k] = x
    xb = xb.reshape(m, nb, block_size)
    amax = np.abs(xb).max(axis=-1)
    scale = np.maximum(amax, np.float32(1e-4)) / np.float32(448.0)  # IEEE division
    if scale_format == "ue8m0":
        scale = np.exp2(np.ceil(np.log2(scale.astype(np.float64)))).astype(np.float32)
    inv = np.float32(1.0) / scale
    y = np.clip(xb * inv[:, :, None], np.float32(-448), np.float32(448))
    q = y.astype(ml_dtypes.float8_e4m3fn).reshape(m, nb * block_size)[:, :k]
    return q, scale


# ---------------------------------------------------------------------------------------------
# Kernel == reference, bit for bit


@pytest.mark.parametrize("scale_format", FORMATS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize(
    "m, k",
    [
        (1, 128),  # one token, exactly one block
        (5, 129),  # one column past a block boundary
        (17, 300),  # M not a multiple of 16, K not a multiple of 128
        (65, 256),  # two row tiles (the tile is 64 rows), block boundary
    ],
)
def test_matches_reference_bit_exact(m, k, dtype, scale_format):
    rng = np.random.default_rng(m * 1000 + k)
    x = _activations(rng, m, k, dtype)
    q, s = fp8_block_quant(x, scale_format=scale_format)
    q_ref, s_ref = fp8_quant_ref(x, scale_format=scale_format)
    assert q.dtype == jnp.float8_e4m3fn and q.shape == (m, k)
    assert s.dtype == jnp.float32 and s.shape == (m, math.ceil(k / 128))
    _assert_bits_equal(s, s_ref, "scales")
    _assert_bits_equal(q, q_ref, "q")
    assert np.all(np.isfinite(np.asarray(s))) and np.all(np.asarray(s) > 0)
    assert not np.any(np.isnan(np.asarray(q, np.float32)))


@pytest.mark.parametrize(
    "block_size, m, k",
    [
        (16, 3, 40),  # smallest block, K not a multiple
        (48, 2, 100),  # not a power of two: padded to 64-wide tiles
        (256, 1, 257),  # one past a wide block
        (128, 3, 1),  # a single column
    ],
)
def test_block_sizes_bit_exact(block_size, m, k):
    x = _activations(np.random.default_rng(k), m, k, jnp.bfloat16, block_size)
    for scale_format in FORMATS:
        q, s = fp8_block_quant(x, block_size=block_size, scale_format=scale_format)
        q_ref, s_ref = fp8_quant_ref(x, block_size=block_size, scale_format=scale_format)
        assert s.shape == (m, -(-k // block_size))
        _assert_bits_equal(s, s_ref, f"scales {block_size=} {scale_format}")
        _assert_bits_equal(q, q_ref, f"q {block_size=} {scale_format}")


@pytest.mark.parametrize("scale_format", FORMATS)
def test_reference_matches_numpy_model_with_ties(scale_format):
    """The reference (and so the kernel) rounds to nearest even, saturates at 448 and makes
    ue8m0 scales exact powers of two, judged by numpy + ml_dtypes, not by XLA."""
    rng = np.random.default_rng(7)
    x = _activations(rng, 6, 160, jnp.float32, 32)
    x = np.array(x)
    # Row 0: exact e4m3 ties. Every 32-column block has max |x| = 100, so its ue8m0 scale is
    # 0.25 (100 / 448 lies in (1/8, 1/4]) and x = midpoint * 0.25 gives x / scale exactly on a
    # midpoint between two e4m3 values.
    e4m3 = np.unique(np.abs(np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)))
    e4m3 = e4m3[np.isfinite(e4m3)].astype(np.float64)
    mids = (e4m3[:-1] + e4m3[1:]) / 2
    tie_cols = np.arange(160) % 32 != 0
    x[0, ~tie_cols] = 100.0
    picks = rng.choice(mids[mids < 400], size=tie_cols.sum())
    x[0, tie_cols] = picks * 0.25 * rng.choice([-1.0, 1.0], size=tie_cols.sum())
    q_np, s_np = _numpy_model(x, 32, scale_format)
    q, s = fp8_block_quant(jnp.asarray(x), block_size=32, scale_format=scale_format)
    q_ref, s_ref = fp8_block_quant_reference(
        jnp.asarray(x), block_size=32, scale_format=scale_format
    )
    _assert_bits_equal(s_ref, s_np, "reference scales vs numpy")
    _assert_bits_equal(q_ref, q_np, "reference q vs numpy")
    _assert_bits_equal(q, q_np, "kernel q vs numpy")
    if scale_format == "ue8m0":
        mant, _ = np.frexp(np.asarray(s, np.float64))
        assert np.all(mant == 0.5), "ue8m0 scales must be powers of two"
        np.testing.assert_array_equal(np.asarray(s[0]), np.full(5, 0.25, np.float32))
        # The ties really were ties, and both directions occur (to the even neighbour).
        y = np.abs(x[0, tie_cols].astype(np.float64)) / 0.25
        assert np.isin(y, mids).all()
        qv = np.abs(np.asarray(q[0, tie_cols], np.float64))
        lower = e4m3[np.searchsorted(e4m3, y) - 1]
        assert np.any(qv == lower) and np.any(qv > lower)


def test_zeros_give_floor_scale_and_zeros():
    x = jnp.zeros((3, 200), jnp.bfloat16)
    floor = np.float32(1e-4) / np.float32(448.0)
    q, s = fp8_block_quant(x)
    assert np.all(np.asarray(q, np.float32) == 0) and not np.any(_bits(q))
    np.testing.assert_array_equal(np.asarray(s), np.full((3, 2), floor, np.float32))
    q8, s8 = fp8_block_quant(x, scale_format="ue8m0")
    assert not np.any(_bits(q8))
    # The smallest power of two >= the floor scale.
    want = np.float32(2.0 ** math.ceil(math.log2(float(floor))))
    np.testing.assert_array_equal(np.asarray(s8), np.full((3, 2), want, np.float32))


@pytest.mark.parametrize("scale_format", FORMATS)
def test_block_max_saturates_to_448(scale_format):
    """x / scale can land a rounding above 448 for the block's max: it must clamp, never NaN."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    x[:, 7] = np.float32([448.0, -3.0e38, 1.0e4, 6.0])  # max |x| of block 0 of each row
    q, s = fp8_block_quant(jnp.asarray(x), scale_format=scale_format)
    q = np.asarray(q, np.float32)
    assert not np.any(np.isnan(q))
    assert np.all(np.abs(q) <= 448)
    if scale_format == "f32":
        # The block max maps onto the largest e4m3 value.
        np.testing.assert_array_equal(np.abs(q[:, 7]), np.full(4, 448.0, np.float32))


def test_empty_inputs():
    q, s = fp8_block_quant(jnp.zeros((0, 300), jnp.bfloat16))
    assert q.shape == (0, 300) and q.dtype == jnp.float8_e4m3fn and s.shape == (0, 3)
    q, s = fp8_block_quant(jnp.zeros((4, 0), jnp.float32))
    assert q.shape == (4, 0) and s.shape == (4, 0)


def test_under_jit():
    x = _activations(np.random.default_rng(1), 9, 140, jnp.float16)
    f = jax.jit(functools.partial(fp8_block_quant, scale_format="ue8m0"))
    q, s = f(x)
    q_ref, s_ref = fp8_quant_ref(x, scale_format="ue8m0")
    _assert_bits_equal(q, q_ref, "q under jit")
    _assert_bits_equal(s, s_ref, "scales under jit")


# ---------------------------------------------------------------------------------------------
# Dequantization error bound
#
# With y = fl(x * fl(1/s)) (at most 2^-23 relative from x/s), clamped to [-448, 448], and
# q = RNE_e4m3(y): e4m3 keeps 3 mantissa bits, so in its normal range (|y| >= 2^-6) the
# rounding error is at most half an ulp = 2^(e-4) for 2^e <= |y|, i.e. <= 2^-4 |y|; in its
# subnormal range (|y| < 2^-6) the ulp is 2^-9 and the error at most 2^-10. Multiplying by s:
#     |q*s - x| <= max(2^-4 |x|, 2^-10 s) + 2^-20 |x|,
# the last term covering the f32 roundings of the reciprocal and the product (and the clamp,
# which moves y by at most a few f32 ulps since |x| <= amax ~ 448 s). The issue's `s / 2` is
# the bound for the subnormal range only: near 448 one e4m3 ulp is 32, so the error reaches
# 16 s there.


@settings(max_examples=15, deadline=None)
@given(
    shape=st.sampled_from([(1, 16), (3, 200), (17, 130)]),
    dtype=st.sampled_from(DTYPES),
    scale_format=st.sampled_from(FORMATS),
    log_magnitude=st.integers(-30, 30),
    spread=st.integers(0, 20),
    seed=st.integers(0, 2**32 - 1),
)
def test_dequantization_error_bound(shape, dtype, scale_format, log_magnitude, spread, seed):
    rng = np.random.default_rng(seed)
    finfo = jnp.finfo(dtype)
    x = rng.standard_normal(shape) * np.exp2(
        log_magnitude + rng.integers(-spread, spread + 1, shape)
    )
    x = jnp.asarray(np.clip(x, -float(finfo.max), float(finfo.max)), dtype)
    q, s = fp8_block_quant(x, block_size=16 if shape[1] == 16 else 64, scale_format=scale_format)
    block = 16 if shape[1] == 16 else 64
    xf = np.asarray(x, np.float64)
    sf = np.repeat(np.asarray(s, np.float64), block, axis=1)[:, : shape[1]]
    qf = np.asarray(q, np.float64)
    err = np.abs(qf * sf - xf)
    bound = np.maximum(2.0**-4 * np.abs(xf), 2.0**-10 * sf) + 2.0**-20 * np.abs(xf)
    worst = np.unravel_index(np.argmax(err - bound), err.shape)
    assert np.all(err <= bound), (
        f"|q*s - x| = {err[worst]:.6g} > bound {bound[worst]:.6g} at {worst}: "
        f"x={xf[worst]!r} q={qf[worst]!r} s={sf[worst]!r}"
    )


# ---------------------------------------------------------------------------------------------
# Arena form


M_MAX = 40  # the plan's max_batch_tokens: ceil16 -> 48 rows
HIDDEN = 300  # max_proj_k of the tiny config below (not a multiple of 128)


@functools.cache
def _seed_plan(guard_bytes: int = 64) -> ArenaPlan:
    """The whole seed layout of a tiny model, sized by `BufferSizes` (the one byte formula)."""
    config = ModelConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        intermediate_size=64,
        vocab_size=16,
    )
    sizes = BufferSizes.from_config(
        config, M_MAX, 64, 0, 1, levers=Levers(), target=Target.preset("hopper")
    )
    return ArenaPlan.sequential(sizes, guard_bytes=guard_bytes)


@pytest.mark.parametrize(
    "m, k, scale_format",
    [(20, HIDDEN, "f32"), (M_MAX, 200, "ue8m0"), (1, HIDDEN, "f32")],
)
def test_arena_form_writes_three_regions_in_place(m, k, scale_format):
    plan = _seed_plan()
    before = random_arena(plan, seed=m)
    x = _activations(np.random.default_rng(m + k), m, k, jnp.bfloat16)
    rows, nb = -(-m // 16) * 16, -(-k // 128)

    step = jax.jit(
        functools.partial(fp8_block_quant_into, plan=plan, scale_format=scale_format),
        donate_argnums=0,
    )
    arena = step(jnp.asarray(before), x=x)

    q, s = fp8_block_quant(x, scale_format=scale_format)
    # Pad rows: what an all-zero row quantizes to (zeros, the floor scale of this format).
    q_pad, s_pad = fp8_quant_ref(jnp.zeros((rows - m, k), jnp.bfloat16), scale_format=scale_format)
    want_q = np.concatenate([_bits(q), _bits(q_pad)])
    want_s = np.concatenate([np.asarray(s), np.asarray(s_pad)])
    assert not np.any(want_q[m:]) and np.all(np.isfinite(want_s[m:])) and np.all(want_s > 0)

    _assert_bits_equal(plan.view(arena, "fp8_act", (rows, k), jnp.uint8), want_q, "fp8_act")
    _assert_bits_equal(
        plan.view(arena, "fp8_act_scale", (rows, nb), jnp.float32), want_s, "fp8_act_scale"
    )
    _assert_bits_equal(
        plan.view(arena, "fp8_act_scale_kmajor", (nb, rows), jnp.float32),
        want_s.T,
        "fp8_act_scale_kmajor",
    )

    # Nothing else changed: every byte outside the three written spans (the rest of those
    # regions, every other region, every guard band) is what it was.
    after = np.asarray(arena).reshape(-1)
    written = np.zeros(after.size, bool)
    for name, nbytes in (
        ("fp8_act", rows * k),
        ("fp8_act_scale", rows * nb * 4),
        ("fp8_act_scale_kmajor", rows * nb * 4),
    ):
        off = plan.regions[name].offset_bytes
        written[off : off + nbytes] = True
    changed = np.flatnonzero((after != before.reshape(-1)) & ~written)
    assert changed.size == 0, f"{changed.size} bytes outside the written spans changed"
    assert plan.check_guards(arena) == []


def test_arena_form_aliases_the_donated_arena():
    plan = _seed_plan()
    x = jax.ShapeDtypeStruct((20, HIDDEN), jnp.bfloat16)
    arena = jax.ShapeDtypeStruct(plan.arena_shape, jnp.uint8)
    step = jax.jit(functools.partial(fp8_block_quant_into, plan=plan), donate_argnums=0)
    assert "input_output_alias" in step.lower(arena, x=x).compile().as_text()
    assert_footprint(step, arena, fn_kwargs={"x": x}, min_alias_bytes=plan.total_bytes)


@pytest.mark.parametrize(
    "m, k, block_size, region",
    [
        (M_MAX + 9, HIDDEN, 128, "fp8_act"),  # ceil16(49) = 64 rows > 48
        (M_MAX, HIDDEN + 1, 128, "fp8_act"),  # K past max_proj_k
        (M_MAX, HIDDEN, 64, "fp8_act_scale"),  # 5 scales per row where the seed sized 3
    ],
)
def test_arena_form_rejects_what_does_not_fit(m, k, block_size, region):
    plan = _seed_plan()
    arena = plan.allocate()
    x = jnp.zeros((m, k), jnp.bfloat16)
    with pytest.raises(ValueError, match=region):
        fp8_block_quant_into(arena, plan, x, block_size=block_size)


def test_arena_form_rejects_missing_region_and_foreign_arena():
    plan = ArenaPlan.sequential({"fp8_act": 4096, "fp8_act_scale": 4096})
    x = jnp.zeros((4, 64), jnp.float32)
    with pytest.raises(ValueError, match="fp8_act_scale_kmajor"):
        fp8_block_quant_into(plan.allocate(), plan, x)
    seed = _seed_plan()
    with pytest.raises(ValueError, match="arena"):
        fp8_block_quant_into(plan.allocate(), seed, x)


# ---------------------------------------------------------------------------------------------
# GPU lowering (on the CPU machine)


@pytest.mark.parametrize("scale_format, block_size", [("f32", 128), ("ue8m0", 48)])
def test_lowers_for_cuda_with_triton(scale_format, block_size):
    x = jax.ShapeDtypeStruct((20, 300), jnp.bfloat16)
    f = functools.partial(
        fp8_block_quant, block_size=block_size, scale_format=scale_format, interpret=False
    )
    text = cuda_lowering_text(f, x)
    assert "__gpu$xla.gpu.triton" in text
    # The IEEE reciprocal (inline PTX) is in the Triton module: no approximate division.
    assert "rcp.rn.f32" in text


# ---------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    "x, kwargs, error, match",
    [
        (jax.ShapeDtypeStruct((128,), jnp.float32), {}, ValueError, "2-D"),
        (jax.ShapeDtypeStruct((2, 3, 128), jnp.float32), {}, ValueError, "2-D"),
        (jax.ShapeDtypeStruct((2, 128), jnp.int8), {}, ValueError, "floating"),
        (jax.ShapeDtypeStruct((2, 128), jnp.bool_), {}, ValueError, "floating"),
        (jax.ShapeDtypeStruct((2, 128), jnp.float32), {"block_size": 0}, ValueError, "16"),
        (jax.ShapeDtypeStruct((2, 128), jnp.float32), {"block_size": -16}, ValueError, "16"),
        (jax.ShapeDtypeStruct((2, 128), jnp.float32), {"block_size": 24}, ValueError, "16"),
        (jax.ShapeDtypeStruct((2, 128), jnp.float32), {"block_size": 128.0}, ValueError, "int"),
        (jax.ShapeDtypeStruct((2, 128), jnp.float32), {"block_size": True}, ValueError, "int"),
        (
            jax.ShapeDtypeStruct((2, 128), jnp.float32),
            {"scale_format": "e8m0"},
            ValueError,
            "scale_format",
        ),
        (np.zeros((2, 128), np.float64), {}, NotImplementedError, "float64"),
        (jax.ShapeDtypeStruct((2, 128), jnp.float8_e4m3fn), {}, NotImplementedError, "float8"),
        (
            jax.ShapeDtypeStruct((2, 128), jnp.float32),
            {"block_size": 16384},
            NotImplementedError,
            "block_size",
        ),
    ],
)
def test_validation(x, kwargs, error, match):
    # ShapeDtypeStructs cannot be computed on: the error must come from validation, before
    # anything is padded or traced.
    with pytest.raises(error, match=match):
        fp8_block_quant(x, **kwargs)
    plan = _seed_plan()
    with pytest.raises(error, match=match):
        fp8_block_quant_into(plan.allocate(), plan, x, **kwargs)


def test_public_names_have_docstrings():
    # The package re-exports the function under the folder's name, so fetch the module itself.
    fbq = importlib.import_module("pallas_kernels.fp8_block_quant")
    for name in fbq.__all__:
        obj = getattr(fbq, name)
        if callable(obj):
            assert obj.__doc__ and len(obj.__doc__.strip()) > 40, name
    assert set(fbq.SCALE_FORMATS) == set(FORMATS)
    assert fbq.FP8_ACT_REGIONS == ("fp8_act", "fp8_act_scale", "fp8_act_scale_kmajor")
