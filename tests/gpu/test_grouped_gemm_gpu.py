"""The grouped GEMM compiled for an H200 (and a B200) without a GPU: no register spills, and
the reason it exists: `jax.lax.ragged_dot`'s default GPU rewrite pads to a dense batched dot.

Qwen3-30B-A3B's expert shapes: M = 8192 sorted rows (tokens x top_k), K = 2048, N = 768,
G = 128 experts. Measured (jax 0.10.2, H200): ragged_dot temp 4,294,967,808 B (an
`[M, G * K]` bf16 operand, 8192 * 128 * 2048 * 2 = 4 GiB) in 4 launches; the kernel 3,588 B
(its work list) in 7 launches (6 tiny work-list fusions + the kernel). The FP8 form adds the
quantized activations (M * K bytes + f32 scales) as its temp, which the arena form keeps in
`moe_fp8_scratch`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxarena import gpu_aot
from pallas_kernels.grouped_gemm import grouped_gemm, grouped_gemm_fp8  # noqa: E402

S = jax.ShapeDtypeStruct
M, K, N, G = 8192, 2048, 768, 128
KIB = 1 << 10


def test_bf16_kernel_has_no_dense_temp_and_no_spills(target):
    r = gpu_aot.compile_for_gpu(
        functools.partial(grouped_gemm, out_dtype=jnp.float32, interpret=False),
        S((M, K), jnp.bfloat16), S((G, K, N), jnp.bfloat16), S((G,), jnp.int32),
        target=target, no_spills=True, dump_dir=True,
    )  # fmt: skip
    assert r.temp_bytes <= 64 * KIB, r.temp_bytes  # the work list, not an [M, G*K] operand
    assert [k.name for k in r.pallas_kernels] == ["grouped_gemm"]
    assert r.max_spill_bytes == 0


def test_fp8_kernel_compiles_without_spills(target):
    r = gpu_aot.compile_for_gpu(
        functools.partial(grouped_gemm_fp8, interpret=False),
        S((M, K), jnp.bfloat16), S((G, N, K), jnp.float8_e4m3fn),
        S((G, N // 128, K // 128), jnp.float32), S((G,), jnp.int32),
        target=target, no_spills=True, dump_dir=True,
    )  # fmt: skip
    # Temp: the quantized activations and their scales (M*K + M*K/128*4 bytes) plus the list.
    assert r.temp_bytes <= M * K + M * (K // 128) * 4 + 64 * KIB, r.temp_bytes
    assert {k.name for k in r.pallas_kernels} == {"fp8_block_quant", "grouped_gemm_fp8"}
    assert r.max_spill_bytes == 0


def test_ragged_dot_pads_to_a_dense_dot_on_h200(h200):
    """Why the kernel: XLA's GPU rewrite of ragged_dot materialises an [M, G*K] operand. If a
    future XLA stops doing so this test fails, and ragged_dot should be reconsidered."""
    r = gpu_aot.compile_for_gpu(
        lambda a, b, g: jax.lax.ragged_dot(a, b, g, preferred_element_type=jnp.float32),
        S((M, K), jnp.bfloat16), S((G, K, N), jnp.bfloat16), S((G,), jnp.int32),
        target="h200", no_spills=False,
    )  # fmt: skip
    assert r.temp_bytes >= M * G * K * 2, r.temp_bytes


def test_fp8_arena_form_keeps_everything_in_moe_fp8_scratch(target):
    """1024 tokens x top-8 (M = 8192 rows): the quantized activations, scales, work list and
    counter live in the arena. Measured (H200 and B200): temp 2,820 B (vs 17,304,080 B for the
    standalone form at M = 8192), the whole arena aliased, 12 launches (quantize, GEMM, the
    work list's small fusions and its two stores), no spills."""
    from jaxarena import ArenaPlan, workspaces
    from pallas_kernels.grouped_gemm import grouped_gemm_fp8_into

    t, topk = 1024, 8
    lay = workspaces.moe_fp8_scratch_layout(rows=t, top_k=topk, num_experts=G, hidden_size=K,
                                            moe_intermediate_size=N)  # fmt: skip
    plan = ArenaPlan.sequential({"filler": 4096, "moe_fp8_scratch": lay["counter"][0] + 4})

    def fn(a, x, w, s, gs, ids):
        return grouped_gemm_fp8_into(a, plan, x, w, s, gs, layout=lay, row_ids=ids,
                                     interpret=False)  # fmt: skip

    r = gpu_aot.compile_for_gpu(
        fn, S(plan.arena_shape, jnp.uint8), S((t, K), jnp.bfloat16),
        S((G, N, K), jnp.float8_e4m3fn), S((G, N // 128, K // 128), jnp.float32),
        S((G,), jnp.int32), S((t * topk,), jnp.int32),
        target=target, no_spills=True, dump_dir=True, donate_argnums=0,
    )  # fmt: skip
    _assert_in_place_and_small(r, plan)


def _assert_in_place_and_small(r, plan) -> None:
    """The arena aliased whole, at most 64 KiB of temp, the quantizer and the arena-form GEMM
    as the only Pallas kernels, no spills."""
    assert r.alias_bytes == plan.total_bytes
    assert r.temp_bytes <= 64 * KIB, r.temp_bytes
    assert {k.name for k in r.pallas_kernels} == {"fp8_block_quant_inplace",
                                                  "grouped_gemm_fp8_arena"}  # fmt: skip
    assert r.max_spill_bytes == 0


def test_fp8_arena_form_reads_a_layers_experts_in_place(h200):
    """`group_offset` (a scanned MoE layer's experts of the layer-stacked weights, 4 layers of
    128 experts here): the offset is one scalar load per program, so the step costs what the
    plain form does. Measured: temp 2,820 B, 12 launches, no spills, as without the offset
    (the bf16 form likewise: 3,588 B, 7 launches); a copied slice of one layer's experts would
    be G * N * K = 201,326,592 B of temp."""
    from jaxarena import ArenaPlan, workspaces
    from pallas_kernels.grouped_gemm import grouped_gemm_fp8_into

    t, topk, layers = 1024, 8, 4
    lay = workspaces.moe_fp8_scratch_layout(rows=t, top_k=topk, num_experts=G, hidden_size=K,
                                            moe_intermediate_size=N)  # fmt: skip
    plan = ArenaPlan.sequential({"filler": 4096, "moe_fp8_scratch": lay["counter"][0] + 4})

    def fn(a, x, w, s, gs, ids, off):
        return grouped_gemm_fp8_into(a, plan, x, w, s, gs, layout=lay, row_ids=ids,
                                     interpret=False, group_offset=off)  # fmt: skip

    r = gpu_aot.compile_for_gpu(
        fn, S(plan.arena_shape, jnp.uint8), S((t, K), jnp.bfloat16),
        S((layers * G, N, K), jnp.float8_e4m3fn),
        S((layers * G, N // 128, K // 128), jnp.float32), S((G,), jnp.int32),
        S((t * topk,), jnp.int32), S((), jnp.int32),
        target="h200", no_spills=True, dump_dir=True, donate_argnums=0,
    )  # fmt: skip
    _assert_in_place_and_small(r, plan)
