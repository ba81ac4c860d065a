"""The block-FP8 grouped GEMM's arena form: `moe_fp8_scratch` holds the activations, scales,
work list and counter at the seed's offsets (spec §10), the result equals the standalone form
bit for bit, and no other byte of the arena changes. Interpret mode, small shapes."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxarena import ArenaPlan, workspaces
from pallas_kernels.fp8_block_quant import fp8_block_quant_reference
from pallas_kernels.grouped_gemm import grouped_gemm_fp8, grouped_gemm_fp8_into, work_list

T, TOPK, K, N, G = 16, 2, 256, 96, 4
M = T * TOPK
LAYOUT = workspaces.moe_fp8_scratch_layout(rows=T, top_k=TOPK, num_experts=G, hidden_size=K,
                                           moe_intermediate_size=N)  # fmt: skip
SLAB = LAYOUT["counter"][0] + 4
PLAN = ArenaPlan.sequential({"before": 1000, "moe_fp8_scratch": SLAB, "after": 700})


@functools.cache
def _into():
    def fn(arena, x, w, s, gs, ids):
        return grouped_gemm_fp8_into(arena, PLAN, x, w, s, gs, layout=LAYOUT, row_ids=ids)

    return jax.jit(fn, donate_argnums=0)


def _inputs(seed):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((T, K)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((G, N, K)) * 0.1, jnp.float8_e4m3fn)
    s = jnp.asarray(rng.random((G, 1, 2)) + 0.5, jnp.float32)
    ids = jnp.asarray(rng.integers(0, T, M), jnp.int32)
    return x, w, s, ids


def _slab(arena):
    return np.asarray(PLAN.view(arena, "moe_fp8_scratch", (SLAB,), jnp.uint8))


def test_parts_hold_the_seeds_layout_and_the_result_matches_standalone():
    x, w, s, ids = _inputs(0)
    arena = PLAN.allocate()
    noise = jnp.asarray(np.random.default_rng(9).integers(0, 256, PLAN.arena_shape), jnp.uint8)
    before = np.asarray(noise)
    arena = noise
    for sizes in ([9, 0, 13, 7], [0, 32, 0, 0]):  # the second call resets the counter
        gs = jnp.asarray(sizes, jnp.int32)
        arena, out = _into()(arena, x, w, s, gs, ids)
        ref = grouped_gemm_fp8(x, w, s, gs, row_ids=ids, block_m=128)
        np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(ref, np.float32))
        slab = _slab(arena)
        q, sc = fp8_block_quant_reference(x)  # T = ceil16(T): no pad rows
        act_off, _ = LAYOUT["activation"]
        q_bytes = np.asarray(jax.lax.bitcast_convert_type(q, jnp.uint8)).reshape(-1)
        np.testing.assert_array_equal(slab[act_off : act_off + q_bytes.size], q_bytes)
        s_off, _ = LAYOUT["scales"]
        s_bytes = np.asarray(sc, np.float32).view(np.uint8).reshape(-1)
        np.testing.assert_array_equal(slab[s_off : s_off + s_bytes.size], s_bytes)
        items, _, count = work_list(gs, M, 128)
        wl_off, _ = LAYOUT["worklist"]
        i_bytes = np.asarray(items, np.int32).view(np.uint8).reshape(-1)
        np.testing.assert_array_equal(slab[wl_off : wl_off + i_bytes.size], i_bytes)
        c_off, _ = LAYOUT["counter"]
        assert slab[c_off : c_off + 4].view(np.uint32)[0] == int(count[0])
    # No byte outside the written spans changed (the other regions, the gaps between parts).
    after = np.asarray(arena).reshape(-1)
    base = PLAN.regions["moe_fp8_scratch"].offset_bytes
    written = np.zeros(after.size, bool)
    for off, n in ((LAYOUT["activation"][0], T * K), (LAYOUT["scales"][0], T * 2 * 4),
                   (LAYOUT["worklist"][0], i_bytes.size), (LAYOUT["counter"][0], 4)):  # fmt: skip
        written[base + off : base + off + n] = True
    np.testing.assert_array_equal(after[~written], before.reshape(-1)[~written])


def test_a_part_too_small_is_refused():
    x, w, s, ids = _inputs(1)
    small = dict(LAYOUT, worklist=(LAYOUT["worklist"][0], 8))
    with pytest.raises(ValueError, match="part 'worklist' holds 8 bytes"):
        grouped_gemm_fp8_into(PLAN.allocate(), PLAN, x, w, s, jnp.asarray([8, 8, 8, 8]),
                              layout=small, row_ids=ids)  # fmt: skip
    with pytest.raises(ValueError, match="layout must have the parts"):
        grouped_gemm_fp8_into(PLAN.allocate(), PLAN, x, w, s, jnp.asarray([8, 8, 8, 8]),
                              layout={"activation": (0, 1)}, row_ids=ids)  # fmt: skip
