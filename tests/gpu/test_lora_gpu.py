"""GPU compile gate of the batched LoRA kernels (`pallas_kernels.lora_bgmv`), deviceless, for
an H200: the shrink and the expand of one projection at decode (8 tokens, every token its own
slot) and prefill (2048 tokens) shapes of Qwen3-8B-like widths (hidden 4096, rank 16, 8
slots; a 1024 -> 3072 projection at rank 64): two Pallas launches, no register spills, no
stack, and XLA temp no more than the shrink's `[T, r]` output."""

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
    assert [x.name for x in kernels] == ["lora_bgmv", "lora_bgmv"], kernels
    for x in kernels:
        assert (x.spill_store_bytes, x.spill_load_bytes, x.stack_bytes) == (0, 0, 0), x
    # The shrink's float32 [T, r] output (then its bf16 copy) is the only intermediate.
    assert res.temp_bytes <= t * r * (4 + 2) + 1024, res.temp_bytes
    assert res.launches is not None and res.launches <= 4, res.launches
