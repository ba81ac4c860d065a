"""The grouped GEMM's `group_offset`: group `g` reads weight `group_offset + g` of a
layer-stacked weight `[L * E, ...]` in place (a scanned MoE layer's experts, no sliced copy).

The offset only moves which weight a program loads; the tiles, the work list and the order of
every sum are those of the call on the sliced weight. So the result with an offset must equal
the call on `rhs[offset : offset + G]` bit for bit (no tolerance: any difference means a wrong
weight or scale was read), for a traced offset too (one compiled function for every layer),
and the sliced call itself is checked against the per-group reference in
test_grouped_gemm.py / test_grouped_gemm_fp8.py / test_grouped_gemm_arena.py. Interpret mode,
small shapes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxarena import ArenaPlan, workspaces
from pallas_kernels.grouped_gemm import (
    grouped_gemm,
    grouped_gemm_fp8,
    grouped_gemm_fp8_into,
    grouped_gemm_reference,
)

L, G = 3, 4  # layers, experts per layer
SIZES = [7, 0, 13, 4]  # an empty group, a tile straddling groups (block_m 16)


@functools.cache
def _bf16():
    return jax.jit(lambda x, w, gs, off: grouped_gemm(x, w, gs, group_offset=off, block_m=16,
                                                      out_dtype=jnp.float32))  # fmt: skip


def test_bf16_offset_reads_that_layers_experts():
    rng = np.random.default_rng(0)
    m, k, n = 24, 40, 72
    x = jnp.asarray(rng.standard_normal((m, k)) / 10, jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((L * G, k, n)) / 10, jnp.bfloat16)
    gs = jnp.asarray(SIZES, jnp.int32)
    for layer in range(L):
        off = jnp.int32(layer * G)  # traced: one compile serves every layer
        got = np.asarray(_bf16()(x, w, gs, off))
        part = w[layer * G : (layer + 1) * G]
        want = np.asarray(grouped_gemm(x, part, gs, block_m=16, out_dtype=jnp.float32))
        np.testing.assert_array_equal(got, want)
        # and that is this layer's product, not another's (layers differ by far more than
        # the f32 sum-order error, K * 2^-24 relative).
        ref = grouped_gemm_reference(np.asarray(x, np.float64), np.asarray(part, np.float64), SIZES)
        np.testing.assert_allclose(got, ref, rtol=0, atol=k * 2.0**-24 * np.abs(ref).max() + 1e-30)
    # A traced offset past the last layer is clipped to it (no read outside the weight).
    last = np.asarray(_bf16()(x, w, gs, jnp.int32(L * G + 5)))
    np.testing.assert_array_equal(last, np.asarray(_bf16()(x, w, gs, jnp.int32((L - 1) * G))))


def _fp8_weights(rng, n, k):
    w = jnp.asarray(rng.standard_normal((L * G, n, k)) * 0.1, jnp.float8_e4m3fn)
    s = jnp.asarray(rng.random((L * G, -(-n // 128), -(-k // 128))) + 0.5, jnp.float32)
    return w, s


def test_fp8_offset_reads_that_layers_experts_and_scales():
    rng = np.random.default_rng(1)
    m, k, n = 24, 256, 96
    x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
    w, s = _fp8_weights(rng, n, k)
    gs = jnp.asarray(SIZES, jnp.int32)
    fn = jax.jit(lambda x, w, s, gs, off: grouped_gemm_fp8(x, w, s, gs, group_offset=off,
                                                           block_m=16))  # fmt: skip
    for layer in (0, L - 1):
        got = np.asarray(fn(x, w, s, gs, jnp.int32(layer * G)), np.float32)
        sl = slice(layer * G, (layer + 1) * G)
        want = grouped_gemm_fp8(x, w[sl], s[sl], gs, block_m=16)
        np.testing.assert_array_equal(got, np.asarray(want, np.float32))


def test_fp8_arena_form_with_offset_equals_the_sliced_call():
    rng = np.random.default_rng(2)
    t, top_k, k, n = 16, 2, 256, 96
    layout = workspaces.moe_fp8_scratch_layout(rows=t, top_k=top_k, num_experts=G,
                                               hidden_size=k, moe_intermediate_size=n)  # fmt: skip
    slab = layout["counter"][0] + 4
    plan = ArenaPlan.sequential({"moe_fp8_scratch": slab})
    x = jnp.asarray(rng.standard_normal((t, k)), jnp.bfloat16)
    w, s = _fp8_weights(rng, n, k)
    ids = jnp.asarray(rng.integers(0, t, t * top_k), jnp.int32)
    gs = jnp.asarray([9, 0, 13, 10], jnp.int32)

    @jax.jit
    def fn(arena, off):
        return grouped_gemm_fp8_into(arena, plan, x, w, s, gs, layout=layout, row_ids=ids,
                                     group_offset=off)  # fmt: skip

    _, got = fn(plan.allocate(), jnp.int32(G))
    want = grouped_gemm_fp8(x, w[G : 2 * G], s[G : 2 * G], gs, row_ids=ids, block_m=128)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize(
    "sizes, offset, match",
    [
        ([1] * (L * G + 1), 0, r"group_sizes.shape=\(13,\) must have at most one entry"),
        (SIZES, (L - 1) * G + 1, r"group_offset=9 must be in \[0, 8\]"),
        (SIZES, -1, r"group_offset=-1 must be in \[0, 8\]"),
        (SIZES, 1.5, r"group_offset .* must be one integer"),
        (SIZES, np.array([0, 4]), r"group_offset .* must be one integer"),
    ],
)
def test_bad_offset_is_refused(sizes, offset, match):
    x = jnp.zeros((16, 8), jnp.bfloat16)
    w = jnp.zeros((L * G, 8, 8), jnp.bfloat16)
    with pytest.raises(ValueError, match=match):
        grouped_gemm(x, w, jnp.asarray(sizes, jnp.int32), group_offset=offset)


def test_without_offset_the_group_count_must_match():
    x, w = jnp.zeros((16, 8), jnp.bfloat16), jnp.zeros((L * G, 8, 8), jnp.bfloat16)
    with pytest.raises(ValueError, match="one entry per group of rhs"):
        grouped_gemm(x, w, jnp.asarray(SIZES, jnp.int32))
