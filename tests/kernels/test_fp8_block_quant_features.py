"""Issue 15's FP8 features: scale layouts (column-major f32, packed UE8M0), fused SiLU-and-mul,
group sizes 32/64/128, standalone and in the arena, against the independent reference.

Interpret mode on CPU, small shapes. The kernel matches the reference bit for bit (q's e4m3
bits, the scales' bits); the reference's packing is checked against a numpy transcription of
the layout DeepGEMM documents for its SM100 kernels, and its SiLU product against float64.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.arena import random_arena

from jaxarena import ArenaPlan
from pallas_kernels.fp8_block_quant import (
    FFN_ACT_REGIONS,
    fp8_block_quant,
    fp8_block_quant_into,
    fp8_block_quant_reference,
    fp8_silu_mul_quant,
    fp8_silu_mul_quant_into,
    fp8_silu_mul_quant_reference,
)


def _bits(a) -> np.ndarray:
    a = np.asarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _assert_bits_equal(got, want, what: str) -> None:
    g, w = _bits(got), _bits(want)
    assert g.shape == w.shape, (what, g.shape, w.shape)
    bad = np.argwhere(g != w)
    assert bad.size == 0, f"{what}: {len(bad)} of {g.size} differ; first at {tuple(bad[0])}"


def _x(rng, m, k, dtype, scale=4.0):
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-8, 8, (m, 1))) * scale
    if m > 1:
        x[1, : min(k, 32)] = 0.0  # an all-zero group
    return jnp.asarray(x.astype(np.float32)).astype(dtype)


def _deepgemm_packed(scales: np.ndarray) -> np.ndarray:
    """numpy transcription of DeepGEMM's documented SM100 scale layout
    (`get_mn_major_tma_aligned_packed_ue8m0_tensor`): the UE8M0 byte is the f32 bits >> 23;
    pad MN to a multiple of 4 (TMA: 16 bytes / 4-byte words) and groups to a multiple of 4 with
    zero bytes; view each row's bytes as little-endian int32 words; store MN-major, i.e. the
    physical array is `[groups / 4, align4(MN)]`. Pad rows here are given, not zeroed: the
    caller passes scales for all `align4(M)` rows (a 0 scale gives a 0 byte)."""
    mn, nb = scales.shape
    assert mn % 4 == 0
    ue8m0 = (scales.astype(np.float32).view(np.uint32) >> 23).astype(np.uint8)
    padded = np.zeros((mn, -(-nb // 4) * 4), np.uint8)
    padded[:, :nb] = ue8m0
    return np.ascontiguousarray(padded.view("<i4").T)


# ---------------------------------------------------------------------------------------------
# Standalone


@pytest.mark.parametrize(
    "m, k, block_size, scale_format, scale_layout",
    [
        (5, 300, 32, "ue8m0", "packed_ue8m0"),  # 10 groups: the last word half empty
        (17, 520, 64, "ue8m0", "packed_ue8m0"),  # M not a multiple of 4: pad rows
        (17, 520, 128, "ue8m0", "packed_ue8m0"),  # 5 groups
        (5, 300, 64, "f32", "col"),
        (17, 520, 128, "ue8m0", "col"),
        (17, 520, 32, "f32", "row"),
    ],
)
def test_layouts_and_groups_bit_exact(m, k, block_size, scale_format, scale_layout):
    x = _x(np.random.default_rng(m * k + block_size), m, k, jnp.bfloat16)
    kw = dict(block_size=block_size, scale_format=scale_format, scale_layout=scale_layout)
    q, s = fp8_block_quant(x, **kw)
    q_ref, s_ref = fp8_block_quant_reference(x, **kw)
    nb, rows = -(-k // block_size), -(-m // 4) * 4
    want_shape = {"row": (m, nb), "col": (nb, rows), "packed_ue8m0": (-(-nb // 4), rows)}
    assert s.shape == want_shape[scale_layout]
    assert s.dtype == (jnp.int32 if scale_layout == "packed_ue8m0" else jnp.float32)
    _assert_bits_equal(q, q_ref, "q")
    _assert_bits_equal(s, s_ref, "scales")
    if scale_layout == "packed_ue8m0":
        # The reference's packing against DeepGEMM's layout, from the row-major f32 scales of
        # the M rows; the pad rows' words are 0 (vLLM's packed quantizer).
        _, s_rows = fp8_block_quant_reference(x, block_size=block_size, scale_format="ue8m0")
        s_rows = np.concatenate([np.asarray(s_rows), np.zeros((rows - m, nb), np.float32)])
        np.testing.assert_array_equal(np.asarray(s_ref), _deepgemm_packed(s_rows))
        # Bytes of groups past nb and of pad rows are zero; the others decode to the scales.
        words = np.ascontiguousarray(np.asarray(s).T).view(np.uint8).reshape(rows, -1)
        assert not np.any(words[:, nb:]) and not np.any(words[m:])
        np.testing.assert_array_equal(
            np.exp2(words[:m, :nb].astype(np.float64) - 127), np.asarray(s_rows)[:m]
        )
    if scale_layout == "col":
        _, s_row = fp8_block_quant(x, block_size=block_size, scale_format=scale_format)
        _assert_bits_equal(s[:, :m].T, s_row, "col layout = transposed row layout")
        floor = np.float32(1e-4) / np.float32(448)
        if scale_format == "f32":
            assert np.all(np.asarray(s[:, m:]) == floor)  # pad rows: zero rows


def test_scale_is_exact_division_by_448():
    """`scale = amax / 448` correctly rounded (numpy's IEEE division), also where the old
    `amax * f32(1/448)` is one ulp off; an amax chosen to be such a case is included."""
    rng = np.random.default_rng(11)
    amax = np.abs(rng.standard_normal(512).astype(np.float32)) * 10 + np.float32(1e-3)
    wrong = amax * np.float32(1 / 448) != amax / np.float32(448)
    assert wrong.sum() > 100  # the product differs often: the test can tell them apart
    x = np.zeros((512, 128), np.float32)
    x[:, 5] = amax
    x[:, 6] = -amax / 2
    _, s = fp8_block_quant(jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(s)[:, 0], amax / np.float32(448))


@pytest.mark.parametrize(
    "dtype, block_size, scale_format, scale_layout",
    [
        (jnp.float32, 32, "f32", "row"),
        (jnp.bfloat16, 64, "ue8m0", "packed_ue8m0"),
        (jnp.bfloat16, 128, "f32", "col"),
        (jnp.float16, 128, "ue8m0", "row"),
    ],
)
def test_silu_mul_matches_reference(dtype, block_size, scale_format, scale_layout):
    rng = np.random.default_rng(block_size)
    m, k = 9, 384
    gate = _x(rng, m, k, dtype, scale=2.0)
    up = _x(rng, m, k, dtype, scale=3.0)
    gate = gate.at[0, 0].set(-200.0).at[0, 1].set(200.0)  # exp overflow / silu(g) = g
    kw = dict(block_size=block_size, scale_format=scale_format, scale_layout=scale_layout)
    q, s = fp8_silu_mul_quant(gate, up, **kw)
    q_ref, s_ref = fp8_silu_mul_quant_reference(gate, up, **kw)
    _assert_bits_equal(s, s_ref, "scales")
    _assert_bits_equal(q, q_ref, "q")
    assert not np.any(np.isnan(np.asarray(q, np.float32)))


def test_silu_mul_reference_against_float64():
    """The reference's f32 `silu(g) * u` against float64: exp, the division and two products
    in f32 give at most a few ulps (bound 2^-20 relative, 8 ulps): the reference quantizes
    a' = a (1 + d), |d| <= 2^-20, and the dequantized value obeys the e4m3 bound of
    test_fp8_block_quant for a' (2^-4 |a'| + 2^-10 s), so it is within
    2^-4 |a| + 2^-10 s + 2^-20 (1 + 2^-4) |a| of the true product."""
    rng = np.random.default_rng(5)
    g = rng.standard_normal((16, 256)).astype(np.float32) * 4
    u = rng.standard_normal((16, 256)).astype(np.float32) * 4
    a64 = g.astype(np.float64) / (1 + np.exp(-g.astype(np.float64))) * u
    q, s = fp8_silu_mul_quant_reference(jnp.asarray(g), jnp.asarray(u), block_size=64)
    sf = np.repeat(np.asarray(s, np.float64), 64, axis=1)
    err = np.abs(np.asarray(q, np.float64) * sf - a64)
    bound = 2.0**-4 * np.abs(a64) + 2.0**-10 * sf + 2.0**-20 * (1 + 2.0**-4) * np.abs(a64)
    assert np.all(err <= bound)
    amax = np.abs(a64).reshape(16, 4, 64).max(-1)
    np.testing.assert_allclose(np.asarray(s), np.maximum(amax, 1e-4) / 448, rtol=2.0**-20)


# ---------------------------------------------------------------------------------------------
# In the arena


def _plan(m, k, block, *, ffn=False, filler=4096):
    rows, nb = -(-m // 16) * 16, -(-k // block)
    names = FFN_ACT_REGIONS if ffn else ("fp8_act", "fp8_act_scale", "fp8_act_scale_kmajor")
    return ArenaPlan.sequential(
        {"filler": filler, names[0]: rows * k + 300, names[1]: rows * nb * 4 + 20,
         "other": 1000, names[2]: nb * rows * 4 + 8},  # fmt: skip
        guard_bytes=32,
    )


def _check_arena(plan, before, arena, regions, q, s_row, kmajor):
    """The three regions hold q, the row-major scales and `kmajor`; nothing else changed."""
    rows = s_row.shape[0]
    k = q.shape[1]
    for name, want in zip(regions, (q, s_row, kmajor), strict=True):
        got = plan.view(arena, name, want.shape, want.dtype)
        _assert_bits_equal(got, want, name)
    after = np.asarray(arena).reshape(-1)
    written = np.zeros(after.size, bool)
    for name, nbytes in zip(regions, (rows * k, s_row.size * 4, kmajor.size * 4), strict=True):
        off = plan.regions[name].offset_bytes
        written[off : off + nbytes] = True
    changed = np.flatnonzero((after != np.asarray(before).reshape(-1)) & ~written)
    assert changed.size == 0, f"{changed.size} bytes outside the written spans changed"
    assert plan.check_guards(arena) == []


@pytest.mark.parametrize(
    "m, k, block, fused, scale_format, scale_layout, dtype",
    [
        (20, 300, 128, False, "ue8m0", "packed_ue8m0", jnp.bfloat16),  # partial last group
        (33, 512, 32, True, "f32", "col", jnp.bfloat16),  # K whole arena rows: vector path
        (40, 512, 64, True, "ue8m0", "packed_ue8m0", jnp.float32),
        (1, 384, 128, True, "f32", "col", jnp.float16),
        (17, 1040, 48, False, "ue8m0", "packed_ue8m0", jnp.bfloat16),  # 22 groups: 6 words
    ],
)
def test_arena_forms(m, k, block, fused, scale_format, scale_layout, dtype):
    plan = _plan(m, k, block, ffn=fused)
    rng = np.random.default_rng(m + k)
    before = random_arena(plan, seed=m)
    x = _x(rng, m, k, dtype)
    kw = dict(block_size=block, scale_format=scale_format)
    rows = -(-m // 16) * 16
    pad = ((0, rows - m), (0, 0))
    if fused:
        up = _x(rng, m, k, dtype)
        step = jax.jit(functools.partial(fp8_silu_mul_quant_into, plan=plan,
                                         scale_layout=scale_layout, **kw), donate_argnums=0)  # fmt: skip
        arena = step(jnp.asarray(before), gate=x, up=up)
        q, s_row = fp8_silu_mul_quant_reference(jnp.pad(x, pad), jnp.pad(up, pad), **kw)
        _, kmajor = fp8_silu_mul_quant_reference(jnp.pad(x, pad), jnp.pad(up, pad),
                                                 scale_layout=scale_layout, **kw)  # fmt: skip
        regions = FFN_ACT_REGIONS
    else:
        step = jax.jit(functools.partial(fp8_block_quant_into, plan=plan,
                                         scale_layout=scale_layout, **kw), donate_argnums=0)  # fmt: skip
        arena = step(jnp.asarray(before), x=x)
        q, s_row = fp8_block_quant_reference(jnp.pad(x, pad), **kw)
        _, kmajor = fp8_block_quant_reference(jnp.pad(x, pad), scale_layout=scale_layout, **kw)
        regions = ("fp8_act", "fp8_act_scale", "fp8_act_scale_kmajor")
    q = jax.lax.bitcast_convert_type(q, jnp.uint8)
    if scale_layout == "packed_ue8m0":  # pad tokens: 0 words (vLLM's packed quantizer)
        kmajor = kmajor.at[:, m:].set(0)
    _check_arena(plan, before, arena, regions, np.asarray(q), np.asarray(s_row),
                 np.asarray(kmajor))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Validation (before tracing: ShapeDtypeStructs cannot be computed on)

S = jax.ShapeDtypeStruct


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(scale_layout="packed_ue8m0"), ValueError, "scale_format='ue8m0'"),
        (dict(scale_layout="kmajor"), ValueError, "scale_layout"),
        (dict(block_size=40), ValueError, "multiple of 16"),
    ],
)
def test_validation_standalone(kwargs, error, match):
    x = S((4, 128), jnp.bfloat16)
    with pytest.raises(error, match=match):
        fp8_block_quant(x, **kwargs)
    with pytest.raises(error, match=match):
        fp8_silu_mul_quant(x, x, **kwargs)


def test_validation_gate_up_and_arena():
    with pytest.raises(ValueError, match="same shape and dtype"):
        fp8_silu_mul_quant(S((4, 128), jnp.bfloat16), S((4, 64), jnp.bfloat16))
    with pytest.raises(ValueError, match="same shape and dtype"):
        fp8_silu_mul_quant(S((4, 128), jnp.bfloat16), S((4, 128), jnp.float32))
    plan = _plan(16, 128, 128)
    arena = S(plan.arena_shape, jnp.uint8)
    with pytest.raises(ValueError, match="arena form always writes the row-major"):
        fp8_block_quant_into(arena, plan, S((16, 128), jnp.bfloat16), scale_layout="row")
    with pytest.raises(ValueError, match="ffn_act_a"):  # the fused form's default regions
        fp8_silu_mul_quant_into(arena, plan, S((16, 128), jnp.bfloat16), S((16, 128), jnp.bfloat16))
    odd_k = _plan(16, 126, 128)
    with pytest.raises(NotImplementedError, match="K % 4"):
        fp8_block_quant_into(S(odd_k.arena_shape, jnp.uint8), odd_k, S((16, 126), jnp.bfloat16))
    odd = ArenaPlan.sequential(
        {"filler": 64, "fp8_act": 4096, "fp8_act_scale": 256, "fp8_act_scale_kmajor": 256},
        align_bytes=64,
    )
    with pytest.raises(ValueError, match="256-byte arena row"):
        fp8_block_quant_into(S(odd.arena_shape, jnp.uint8), odd, S((16, 128), jnp.bfloat16))


@pytest.mark.parametrize("packed", [False, True])
def test_arena_form_does_not_copy_the_arena_in_interpret_mode(packed):
    """In interpret mode the kernels get the three regions' rows, not the arena: a whole-arena
    operand is copied on CPU (a bitcast to words, and the interpreter's aliased in/out pair),
    as it was before: ~2x the arena in temp. The bound, 64 KiB: the interpreter's index tables
    for one `[16, 128]` tile (gather `s32[16, 128, 2]` = 16 KiB, scatter 4 KiB), the stacked
    windows (10 rows of 256 B, in and out) and the small x / scale temporaries: well under
    the 1 MiB region `big` alone, which any copy of the arena would need."""
    q, s, t = ("fp8_act", "fp8_act_scale", "fp8_act_scale_kmajor")
    sizes = {"x": 4 * 128 * 2, q: 16 * 128, "gap": 4096, s: 16 * 4, "gap2": 4096, t: 16 * 4}
    plan = ArenaPlan.sequential(sizes | {"big": 1 << 20})
    kw = {"scale_format": "ue8m0", "scale_layout": "packed_ue8m0"} if packed else {}

    def step(arena, h):
        arena = plan.write(arena, "x", h)
        x = plan.view(arena, "x", (4, 128), jnp.bfloat16)
        return fp8_block_quant_into(arena, plan, x, interpret=True, **kw)

    args = (plan.allocate(), jnp.ones((4, 128), jnp.bfloat16))
    mem = jax.jit(step, donate_argnums=0).lower(*args).compile().memory_analysis()
    assert mem.alias_size_in_bytes == plan.total_bytes
    assert mem.temp_size_in_bytes <= 64 * 1024, mem.temp_size_in_bytes


# ---------------------------------------------------------------------------------------------
# vLLM's packed per-token-group grid (issue 29): the storage of the padding


def _vllm_packed_numpy(x: np.ndarray, group: int) -> np.ndarray:
    """numpy model of the packed UE8M0 scale storage `int32[ceil(nb / 4), align4(M)]`:
    `scale = max(amax, 1e-4) / 448` (numpy's f32 division is correctly rounded) rounded up
    to a power of two, its byte the biased exponent (plus one when a mantissa bit is set);
    bytes of groups past `nb` and every byte of tokens past M are 0, as vLLM's packed
    quantizer stores them (its test poisons the buffer first and checks the zeros)."""
    m, k = x.shape
    nb = k // group
    amax = np.abs(x.astype(np.float32)).reshape(m, nb, group).max(axis=-1)
    bits = (np.maximum(amax, np.float32(1e-4)) / np.float32(448)).view(np.uint32)
    byte = (bits >> 23) + ((bits & 0x7FFFFF) != 0)
    out = np.zeros((-(-m // 4) * 4, -(-nb // 4) * 4), np.uint8)
    out[:m, :nb] = byte
    return np.ascontiguousarray(out.view("<i4").T)


VLLM_PACKED = [(t, h) for h in (640, 7168) for t in (1, 3, 127, 253)]


@pytest.mark.parametrize("tokens, hidden", VLLM_PACKED)
def test_packed_ue8m0_matches_vllm_grid(tokens, hidden):
    """vLLM's `test_per_token_group_quant_fp8_packed` shapes with M padding (tokens 1, 3, 127,
    253; hidden 640: 5 groups, K padding too; 7168: 56 groups), group 128, `randn * 8` bf16.
    An all-zero token keeps DeepGEMM's 0x69 byte (vLLM would store 0x5e there)."""
    rng = np.random.default_rng(tokens * hidden)
    x = (rng.standard_normal((tokens, hidden)) * 8).astype(np.float32)
    if tokens > 1:
        x[1] = 0.0
    x = jnp.asarray(x).astype(jnp.bfloat16)
    kw = dict(block_size=128, scale_format="ue8m0", scale_layout="packed_ue8m0")
    q, s = fp8_block_quant(x, **kw)
    want = _vllm_packed_numpy(np.asarray(x.astype(jnp.float32)), 128)
    _assert_bits_equal(s, want, "packed scales")
    q_ref, _ = fp8_block_quant_reference(x, **kw)
    _assert_bits_equal(q, q_ref, "q")
    if tokens > 1:
        row1 = np.ascontiguousarray(np.asarray(s).T)[1].view(np.uint8)[: hidden // 128]
        assert np.all(row1 == 0x69), row1


@pytest.mark.parametrize("tokens, hidden", [(253, 640), (3, 7168)])
def test_packed_ue8m0_arena_zeroes_the_padding(tokens, hidden):
    """The arena form over a poisoned (random) region: tokens past M, up to ceil16(M), hold 0
    words; the rest is the standalone form's packing."""
    plan = _plan(tokens, hidden, 128)
    before = random_arena(plan, seed=tokens)
    x = _x(np.random.default_rng(hidden), tokens, hidden, jnp.bfloat16)
    kw = dict(block_size=128, scale_format="ue8m0", scale_layout="packed_ue8m0")
    step = jax.jit(functools.partial(fp8_block_quant_into, plan=plan, **kw), donate_argnums=0)
    arena = step(jnp.asarray(before), x=x)
    rows, nb4 = -(-tokens // 16) * 16, -(-hidden // 512)
    got = np.asarray(plan.view(arena, "fp8_act_scale_kmajor", (nb4, rows), jnp.int32))
    assert not np.any(got[:, tokens:]), "padding tokens hold non-zero bytes"
    _, s = fp8_block_quant(x, **kw)
    _assert_bits_equal(got[:, :tokens], np.asarray(s)[:, :tokens], "packed scales")
