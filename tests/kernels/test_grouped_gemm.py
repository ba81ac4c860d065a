"""The dropless grouped GEMM against a per-group NumPy reference and `jax.lax.ragged_dot`, on
every pattern of empty groups (tokamax tests all 2^8 for 8 groups), with vLLM's bf16 MoE
tolerance (test_fused_moe: atol 2e-2) and a derived f32 bound.

Interpret mode (CPU), small shapes; one compiled function per shape, `group_sizes` as data.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.grouped_gemm import grouped_gemm, grouped_gemm_reference, work_list

# f32 accumulation of K exact products (bf16 x bf16 is exact in f32): the sum's error is at
# most K * 2^-24 * sum_k |a_k b_k| (Higham's bound, gamma_K), bounded here per entry.
F32_EPS = 2.0**-24


def _f32_bound(lhs, rhs, gs):
    mag = grouped_gemm_reference(np.abs(lhs), np.abs(rhs), gs)
    return lhs.shape[1] * F32_EPS * mag + 1e-30


def _data(m, k, n, g, seed, dtype=jnp.bfloat16):
    rng = np.random.default_rng(seed)
    # vLLM's test_fused_moe draws a = randn / 10, w = randn / 10 (bf16): keep its scale so
    # its atol (2e-2) means what it means there.
    lhs = jnp.asarray(rng.standard_normal((m, k)) / 10, dtype)
    rhs = jnp.asarray(rng.standard_normal((g, k, n)) / 10, dtype)
    return lhs, rhs, rng


@functools.cache
def _jitted(block_m, out_dtype):
    return jax.jit(functools.partial(grouped_gemm, block_m=block_m, out_dtype=out_dtype))


@pytest.mark.parametrize(
    "m,k,n,g,sizes",
    [
        (50, 40, 72, 5, [7, 0, 20, 3, 9]),  # tail rows, partial K / N tiles, an empty group
        (64, 64, 64, 4, [16, 16, 16, 16]),  # tile-aligned groups
        (33, 16, 8, 3, [33, 0, 0]),  # one group holds every row
    ],
)
def test_matches_reference_and_ragged_dot(m, k, n, g, sizes):
    lhs, rhs, _ = _data(m, k, n, g, seed=m)
    gs = jnp.asarray(sizes, jnp.int32)
    out = np.asarray(_jitted(16, jnp.float32)(lhs, rhs, gs))
    l64, r64 = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    ref = grouped_gemm_reference(l64, r64, sizes)
    assert (np.abs(out - ref) <= _f32_bound(l64, r64, sizes)).all()
    total = sum(sizes)
    assert (out[total:] == 0).all()  # rows past the sum are zeros, not garbage
    # ragged_dot (f32 accumulation too) agrees on the rows it defines.
    rd = np.asarray(jax.lax.ragged_dot(lhs, rhs, gs, preferred_element_type=jnp.float32))
    np.testing.assert_allclose(out[:total], rd[:total], atol=2 * _f32_bound(l64, r64, sizes)
                               .max(), rtol=0)  # fmt: skip


def test_bf16_output_within_vllm_tolerance():
    """bf16 in, bf16 out: vLLM's test_fused_moe compares its Triton MoE to torch with atol 2e-2;
    our error is the bf16 rounding of the output (unit roundoff 2^-8: 8 significant bits) plus the f32 bound."""
    m, k, n, g, sizes = 48, 64, 40, 4, [5, 20, 0, 17]
    lhs, rhs, _ = _data(m, k, n, g, seed=7)
    out = np.asarray(_jitted(16, jnp.bfloat16)(lhs, rhs, jnp.asarray(sizes)), np.float64)
    l64, r64 = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    ref = grouped_gemm_reference(l64, r64, sizes)
    err = np.abs(out - ref)
    np.testing.assert_allclose(out, ref, atol=2e-2, rtol=0)
    assert (err <= 2.0**-8 * np.abs(ref) + _f32_bound(l64, r64, sizes)).all()


def test_every_empty_group_pattern():
    """All 2^8 patterns of empty groups of 8 (tokamax's test), one compiled function."""
    m, k, n, g = 40, 32, 24, 8
    lhs, rhs, rng = _data(m, k, n, g, seed=3, dtype=jnp.float32)
    fn = _jitted(16, jnp.float32)
    l64, r64 = np.asarray(lhs, np.float64), np.asarray(rhs, np.float64)
    for pattern in itertools.product([False, True], repeat=g):
        sizes = np.zeros(g, np.int64)
        live = np.flatnonzero(pattern)
        if live.size:
            # Random non-empty sizes summing to at most M (sometimes leaving tail rows).
            total = int(rng.integers(live.size, m + 1))
            cuts = np.sort(rng.choice(np.arange(1, total), live.size - 1, replace=False))
            sizes[live] = np.diff(np.concatenate([[0], cuts, [total]]))
        out = np.asarray(fn(lhs, rhs, jnp.asarray(sizes, jnp.int32)))
        ref = grouped_gemm_reference(l64, r64, sizes)
        bad = np.abs(out - ref) > _f32_bound(l64, r64, sizes)
        assert not bad.any(), (pattern, sizes.tolist(), np.argwhere(bad)[:3])


def test_work_list_visits_straddling_tiles_once_per_group():
    """megablox's metadata: tiles_m + G items at most; a tile shared by k groups appears k
    times; the zero group covers the rows past the sum; unused items are (G + 1, 0)."""
    items, bounds, count = work_list(jnp.asarray([3, 0, 20, 5]), 40, 16)
    items, bounds, count = np.asarray(items), np.asarray(bounds), int(count[0])
    assert items.shape == (3 + 4, 2)
    assert bounds.tolist() == [0, 3, 3, 23, 28, 40]
    # group 0: tile 0; group 2: tiles 0, 1; group 3: tile 1; zero group (4): tiles 1, 2.
    assert items[:count].tolist() == [[0, 0], [2, 0], [2, 1], [3, 1], [4, 1], [4, 2]]
    assert (items[count:] == [5, 0]).all()


@pytest.mark.parametrize(
    "args,match",
    [
        (((4, 8), (2, 8, 4), [2, 2, 0]), "one entry per group"),
        (((4, 8), (2, 6, 4), [2, 2]), "must have K=8"),
        (((4, 8), (2, 8, 4), [3, 3]), "exceeds the 4 rows"),
        (((4, 8), (2, 8, 4), [-1, 3]), r"group_sizes\[0\]=-1"),
        (((4,), (2, 8, 4), [2, 2]), "lhs must be 2-D"),
    ],
)
def test_bad_input_is_refused(args, match):
    (ls, rs, sizes) = args
    lhs, rhs = jnp.zeros(ls, jnp.bfloat16), jnp.zeros(rs, jnp.bfloat16)
    with pytest.raises(ValueError, match=match):
        grouped_gemm(lhs, rhs, jnp.asarray(sizes, jnp.int32))


def test_block_m_is_checked():
    with pytest.raises(ValueError, match="block_m=24"):
        grouped_gemm(jnp.zeros((4, 8)), jnp.zeros((1, 8, 4)), jnp.asarray([4]), block_m=24)


def test_moe_fp8_scratch_layout_holds_the_kernels_work_list():
    """Spec §10's check values, 256-aligned disjoint parts, and room for the kernel's work list
    (8 bytes per item, 128-row tiles) at every row count."""
    from jaxarena.workspaces import moe_fp8_scratch_layout
    from pallas_kernels.grouped_gemm import max_work_items

    kw = dict(top_k=8, num_experts=256, hidden_size=2048, moe_intermediate_size=512,
              shared_expert_intermediate_size=512)  # fmt: skip
    for rows, total in ((2176, 9_292_036), (8, 99_844)):
        lay = moe_fp8_scratch_layout(rows=rows, **kw)
        assert lay["counter"][0] + lay["counter"][1] == total
        spans = [lay[p] for p in ("activation", "scales", "worklist", "counter")]
        assert all(off % 256 == 0 for off, _ in spans)
        assert all(a[0] + a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
        assert max_work_items(rows * 8, 256, 128) * 8 <= lay["worklist"][1]
