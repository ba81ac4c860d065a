"""GPU compile gate of the batched LoRA kernels (`pallas_kernels.lora_bgmv`), deviceless, for
an H200: the shrink and the expand of one projection at decode (8 tokens, every token its own
slot) and prefill (2048 tokens) shapes of Qwen3-8B-like widths (hidden 4096, rank 16, 8
slots; a 1024 -> 3072 projection at rank 64): the one Pallas kernel (twice), no register
spills, no stack, at most two launches besides them, and XLA temp no more than the shrink's
`[T, r]` output. The arena form (the shrink storing into `lora_xa`, the expand reading it
there) keeps no temp that grows with T. (The whole step with adapters against the step
without: benchmarks/lora_costs.py, ~30 s of compiles, too slow for this gate.)"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest

from jaxarena import gpu_aot
from pallas_kernels.lora_bgmv import lora_expand, lora_shrink

BF16 = jnp.bfloat16
# (tokens T, in K, out N, rank r, slots L)
SHAPES = [(8, 4096, 4096, 16, 8), (2048, 4096, 4096, 16, 8), (2048, 1024, 3072, 64, 4)]


@functools.cache
def _compile(shape, target):
    t, k, n, r, num = shape
    sds = jax.ShapeDtypeStruct

    def lora(x, a, b, scale, slots):
        xa = lora_shrink(x, a, slots, interpret=False).astype(BF16)
        return lora_expand(xa, b, scale, slots, interpret=False)

    return gpu_aot.compile_for_gpu(
        lora, sds((t, k), BF16), sds((num, r, k), BF16), sds((num, n, r), BF16),
        sds((num,), jnp.float32), sds((t,), jnp.int32), target=target, no_spills=True,
        dump_dir=True,
    )  # fmt: skip


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "T{}-K{}-N{}-r{}-L{}".format(*s))
def test_lora_kernels_compile_without_spills(h200, shape):
    t, k, n, r, num = shape
    res = _compile(shape, h200)
    kernels = res.pallas_kernels
    assert {x.name for x in kernels} == {"lora_bgmv"}, kernels
    for x in kernels:
        assert (x.spill_store_bytes, x.spill_load_bytes, x.stack_bytes) == (0, 0, 0), x
    # The shrink's float32 [T, r] output (then its bf16 copy) is the only intermediate.
    assert res.temp_bytes <= t * r * (4 + 2) + 1024, res.temp_bytes
    assert res.launches is not None and res.launches <= 4, res.launches


@pytest.mark.parametrize("t", [8, 2048])
def test_expand_into_the_base_output_is_in_place(h200, t):
    """The model's form: the shrink writes bf16 `xa`, the expand adds into the donated base
    output (`[T, 4096]` bf16) on a column range: the output aliases it, and the only temp is
    `xa` (`[T, r]` bf16), whatever the projection's width."""
    from pallas_kernels.lora_bgmv import lora_expand_into

    k, n, r, num, ny = 4096, 1024, 16, 8, 4096
    sds = jax.ShapeDtypeStruct

    def lora(y, x, a, b, scale, slots):
        xa = lora_shrink(x, a, slots, out_dtype=BF16, interpret=False)
        return lora_expand_into(y, xa, b, scale, slots, col0=2048, interpret=False)

    res = gpu_aot.compile_for_gpu(
        lora, sds((t, ny), BF16), sds((t, k), BF16), sds((num, r, k), BF16),
        sds((num, n, r), BF16), sds((num,), jnp.float32), sds((t,), jnp.int32), target=h200,
        donate_argnums=0, no_spills=True, dump_dir=True,
    )  # fmt: skip
    assert {x.name for x in res.pallas_kernels} == {"lora_bgmv"}
    assert res.alias_bytes == t * ny * 2, res.memory_analysis()
    assert res.temp_bytes <= t * r * 2 + 1024, res.temp_bytes
    # The two kernels and one small fusion (the shrink's constant unit scales).
    assert res.launches <= 3, res.launches


@functools.cache
def _compile_in_arena(t, target):
    """The model's form: the shrink stores `xa` into the arena's `lora_xa` region (sized for
    2048 tokens at rank 16), the expand reads it from there and adds into the donated base
    output (`[T, 4096]` bf16) on a column range."""
    from jaxarena import ArenaPlan
    from pallas_kernels.lora_bgmv import lora_expand_from_arena, lora_shrink_into

    k, n, r, num, ny, m = 4096, 1024, 16, 8, 4096, 2048
    plan = ArenaPlan.sequential({"before": 3 << 20, "lora_xa": m * r * 2, "after": 1 << 20})
    sds = jax.ShapeDtypeStruct

    def lora(arena, y, x, a, b, scale, slots):
        arena = lora_shrink_into(arena, plan, x, a, slots, interpret=False)
        y = lora_expand_from_arena(y, arena, plan, b, scale, slots, col0=2048, interpret=False)
        return jax.lax.optimization_barrier((arena, y))

    res = gpu_aot.compile_for_gpu(
        lora, sds(plan.arena_shape, jnp.uint8), sds((t, ny), BF16), sds((t, k), BF16),
        sds((num, r, k), BF16), sds((num, n, r), BF16), sds((num,), jnp.float32),
        sds((t,), jnp.int32), target=target, donate_argnums=(0, 1), no_spills=True,
        dump_dir=True,
    )  # fmt: skip
    return res, plan.total_bytes + t * ny * 2


def test_shrink_into_the_arena_keeps_no_temp_that_grows_with_t(h200):
    """With `xa` in the arena's `lora_xa` region the LoRA path's only temp is the shrink's
    unit scales (`float32[L]`): the same at 256 and 2048 tokens. Both kernels compile without
    spills (no_spills), the arena and the base output are aliased (written in place), and
    nothing but the two kernels and that one small fusion is launched."""
    temps = {}
    for t in (256, 2048):
        res, aliased = _compile_in_arena(t, h200)
        assert {x.name for x in res.pallas_kernels} == {"lora_bgmv"}, res.pallas_kernels
        for x in res.pallas_kernels:
            assert (x.spill_store_bytes, x.spill_load_bytes, x.stack_bytes) == (0, 0, 0), x
        assert res.alias_bytes == aliased, res.memory_analysis()
        assert res.launches is not None and res.launches <= 3, res.launches
        temps[t] = res.temp_bytes
    assert temps[256] == temps[2048] <= 1024, temps
