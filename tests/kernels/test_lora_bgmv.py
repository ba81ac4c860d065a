"""The batched LoRA matmul (`pallas_kernels.lora_bgmv`) in interpret mode against its plain
reference: tokens with different adapters or none (slot -1), prefill segments and decode
rows, sizes that are not multiples of the tiles; a slot no token of a tile uses is never
read; bad arguments are named."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers.tolerances import tol

from jaxarena import ArenaError, ArenaPlan
from pallas_kernels.lora_bgmv import (
    lora_bgmv,
    lora_bgmv_reference,
    lora_expand_from_arena,
    lora_expand_into,
    lora_shrink_into,
)

BF16 = jnp.bfloat16

# (name, depth K, out N, slots L, per-token slots)
CASES = [
    ("one-token", 24, 16, 2, [1]),
    ("prefill-segments", 40, 24, 3, [0] * 5 + [-1] * 3 + [2] * 11),  # 19 rows: 2 tiles
    ("decode-mixed", 48, 17, 4, [3, -1, 0, 2, 1, 1, -1, 0, 3, 2, 0, 1, 2, 3, -1, 0, 1]),
]


def _draw(t, k, n, num, seed=0):
    kx, kw, ks = jax.random.split(jax.random.key(seed), 3)
    x = jax.random.normal(kx, (t, k)).astype(BF16)
    w = jax.random.normal(kw, (num, n, k)).astype(BF16)
    scale = jax.random.uniform(ks, (num,), minval=0.5, maxval=2.0)
    return x, w, scale


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_reference(case):
    _, k, n, num, slots = case
    slots = jnp.asarray(slots, jnp.int32)
    x, w, scale = _draw(slots.shape[0], k, n, num)
    got = lora_bgmv(x, w, scale, slots, interpret=True)
    want = lora_bgmv_reference(x, w, scale, slots)
    assert got.shape == want.shape == (slots.shape[0], n) and got.dtype == jnp.float32
    np.testing.assert_allclose(got, want, **tol("lora", "float32"))
    # Base-model tokens get exact zeros; the others a non-trivial product.
    base = np.asarray(slots) < 0
    assert (np.asarray(got)[base] == 0).all()
    assert (np.abs(np.asarray(got)[~base]).max(-1) > 0.1).all()


def test_unused_slot_is_never_read():
    """NaN weights in the slots no token uses (and in every slot for a base-only batch): a
    kernel that multiplied them, masked or not, would give NaN rows."""
    slots = jnp.asarray([0] * 9 + [-1] * 4, jnp.int32)
    x, w, scale = _draw(13, 32, 16, 3, seed=1)
    w = w.at[1:].set(jnp.nan)
    got = lora_bgmv(x, w, scale, slots, interpret=True)
    np.testing.assert_allclose(got, lora_bgmv_reference(x, w.at[1:].set(0), scale, slots),
                               **tol("lora", "float32"))  # fmt: skip
    none = lora_bgmv(x, w.at[0].set(jnp.nan), scale, jnp.full((13,), -1, jnp.int32),
                     interpret=True)  # fmt: skip
    assert (np.asarray(none) == 0).all()


def test_bad_arguments_are_named():
    x, w, scale = _draw(4, 16, 16, 2)
    slots = jnp.zeros((4,), jnp.int32)
    with pytest.raises(ValueError, match="depth 16 .* must equal x's 8"):
        lora_bgmv(x[:, :8], w, scale, slots)
    with pytest.raises(ValueError, match=r"scale must be \[2\]"):
        lora_bgmv(x, w, scale[:1], slots)
    with pytest.raises(ValueError, match=r"slots \[2\] outside \[-1, 2\)"):
        lora_bgmv(x, w, scale, jnp.asarray([0, 1, 2, -1], jnp.int32))
    with pytest.raises(ValueError, match=r"slots must be int32\[4\]"):
        lora_bgmv(x, w, scale, slots[:3])
    with pytest.raises(ValueError, match="w must be"):
        lora_bgmv(x, w[0], scale, slots)


def test_expand_into_adds_in_place_on_a_column_range():
    """The expand added to a fused output's column range (the k range of q/k/v): rows with
    an adapter get `bf16(bf16(y) + bf16(delta))`, every other element of a float32 `y` keeps
    its unrounded value (o_proj's base rows)."""
    slots = jnp.asarray([1, 1, -1, 0, 2, -1, 0, 1, 1, 1, 2, 2, 0, 0, 1, -1, 2, 0], jnp.int32)
    t, r, n, col0, ny = 18, 16, 24, 40, 88
    xa, b, scale = _draw(t, r, n, 3, seed=4)
    y = jax.random.normal(jax.random.key(5), (t, ny))
    got = np.asarray(lora_expand_into(jnp.copy(y), xa, b, scale, slots, col0=col0,
                                      interpret=True))  # fmt: skip
    delta = lora_bgmv_reference(xa, b, scale, slots).astype(BF16).astype(jnp.float32)
    want = np.asarray(y).copy()
    rows = np.asarray(slots) >= 0
    part = (y[:, col0 : col0 + n].astype(BF16).astype(jnp.float32) + delta).astype(BF16)
    part = part.astype(jnp.float32)
    want[rows, col0 : col0 + n] = np.asarray(part)[rows]
    # Both sides round the same f32 sums to bf16 twice; sums within the f32 bound may round
    # to neighbouring bf16 values: one bf16 ulp (2^-7 relative) on top of the f32 bound.
    np.testing.assert_allclose(got, want, rtol=2.0**-7, atol=tol("lora", "float32")["atol"])
    untouched = np.ones_like(want, bool)
    untouched[rows, col0 : col0 + n] = False
    np.testing.assert_array_equal(got[untouched], np.asarray(y)[untouched])
    with pytest.raises(ValueError, match=r"col0=70 must be an int in \[0, 64\]"):
        lora_expand_into(y, xa, b, scale, slots, col0=70)


def test_shrink_into_the_arena_and_expand_from_it():
    """The shrink stores bf16 `xa` at the start of `lora_xa` (sized for 24 tokens; 19 written,
    rank 16 = 32 B a row, so rows straddle the arena's 256-byte rows): the reference's values
    there, every other byte of the arena (the region's rows past T, the regions around it)
    unchanged. The expand reading `xa` from the region adds `bf16(delta)` of those values into
    the rows with an adapter and touches nothing else."""
    m, r, k, n, num = 24, 16, 40, 24, 3
    plan = ArenaPlan.sequential({"before": 1000, "lora_xa": m * r * 2, "after": 700})
    slots = jnp.asarray([0] * 5 + [-1] * 3 + [2] * 11, jnp.int32)
    t = slots.shape[0]
    x, a, _ = _draw(t, k, r, num, seed=6)
    _, b, scale = _draw(t, r, n, num, seed=7)
    before = jax.random.randint(jax.random.key(8), plan.arena_shape, 0, 256).astype(jnp.uint8)
    arena = lora_shrink_into(jnp.copy(before), plan, x, a, slots, interpret=True)
    xa = plan.view(arena, "lora_xa", (t, r), BF16)
    want = lora_bgmv_reference(x, a, jnp.ones((num,)), slots)
    # bf16 output: the float32 bound plus one rounding of the stored value (2^-8 relative).
    np.testing.assert_allclose(xa.astype(jnp.float32), want, rtol=2.0**-8,
                               atol=tol("lora", "float32")["atol"])  # fmt: skip
    assert (np.asarray(xa)[np.asarray(slots) < 0] == 0).all()
    off = plan.regions["lora_xa"].offset_bytes
    got_b, old_b = np.asarray(arena).reshape(-1), np.asarray(before).reshape(-1)
    outside = np.ones(got_b.shape, bool)
    outside[off : off + t * r * 2] = False
    np.testing.assert_array_equal(got_b[outside], old_b[outside])

    y = jax.random.normal(jax.random.key(9), (t, 56)).astype(BF16)
    got = np.asarray(lora_expand_from_arena(jnp.copy(y), arena, plan, b, scale, slots, col0=8,
                                            interpret=True)).astype(np.float32)  # fmt: skip
    delta = lora_bgmv_reference(xa, b, scale, slots).astype(BF16).astype(jnp.float32)
    rows = np.asarray(slots) >= 0
    want = np.asarray(y.astype(jnp.float32)).copy()
    part = (y[:, 8 : 8 + n].astype(jnp.float32) + delta).astype(BF16).astype(jnp.float32)
    want[rows, 8 : 8 + n] = np.asarray(part)[rows]
    # As test_expand_into_adds_in_place_on_a_column_range: one bf16 ulp on the f32 bound.
    np.testing.assert_allclose(got, want, rtol=2.0**-7, atol=tol("lora", "float32")["atol"])
    untouched = np.ones_like(want, bool)
    untouched[rows, 8 : 8 + n] = False
    np.testing.assert_array_equal(got[untouched], np.asarray(y.astype(jnp.float32))[untouched])

    small = ArenaPlan.sequential({"lora_xa": (t - 1) * r * 2})
    with pytest.raises(ArenaError, match="lora_xa"):
        lora_shrink_into(small.allocate(), small, x, a, slots)
    with pytest.raises(ValueError, match=r"col0=48 must be an int in \[0, 32\]"):
        lora_expand_from_arena(y, arena, plan, b, scale, slots, col0=48)
