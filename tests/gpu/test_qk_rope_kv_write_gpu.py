"""GPU compile gate of the fused decode write (`pallas_kernels.qk_rope_kv_write`), deviceless.

Qwen3-8B widths (32 query heads, 8 KV heads of 128), 64 tokens, a 256-page cache of 16: the
Qwen3 form (bf16 projection, q/k norms, RoPE), the decode step's form (4 float32 split-K
partials) and the FP8 cache with Llama's no-norm form: each is one launch with the register-
spill switch on (ptxas: no spill, no stack), both caches aliased in place.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxarena import gpu_aot
from pallas_kernels.qk_rope_kv_write import qk_rope_kv_write

T, HQ, HKV, D, PAGES, BS = 64, 32, 8, 128, 256, 16
BF16, F32, FP8 = jnp.bfloat16, jnp.float32, jnp.float8_e4m3fn


@pytest.mark.parametrize(("form", "cache_dtype"), [("bf16", BF16), ("split", BF16), ("fp8", FP8)])
def test_one_launch_in_place_without_spills(target, form, cache_dtype):
    sds = jax.ShapeDtypeStruct
    n = (HQ + 2 * HKV) * D
    qkv = sds((4, T, n), F32) if form == "split" else sds((T, n), BF16)
    cache = sds((PAGES, BS, HKV, D), cache_dtype)
    norm = form != "fp8"

    def step(k, v, qkv, pos, tables, w, inv, scale):
        kw = dict(q_norm=w, k_norm=w) if norm else {}
        if cache_dtype == FP8:
            kw |= dict(k_scale=scale, v_scale=scale)
        return qk_rope_kv_write(qkv, k, v, pos, tables, num_q_heads=HQ, inv_freq=inv,
                                interpret=False, **kw)  # fmt: skip

    res = gpu_aot.compile_for_gpu(
        step, cache, cache, qkv, sds((T,), jnp.int32), sds((T, 64), jnp.int32), sds((D,), BF16),
        sds((D // 2,), F32), sds((HKV,), F32), target=target, donate_argnums=(0, 1),
        no_spills=True, dump_dir=True,
    )  # fmt: skip
    (k,) = res.pallas_kernels
    assert k.name == "qk_rope_kv_write"
    assert (k.spill_store_bytes, k.spill_load_bytes, k.stack_bytes) == (0, 0, 0), k
    assert res.launches == 1
    assert res.alias_bytes == 2 * PAGES * BS * HKV * D * jnp.dtype(cache_dtype).itemsize
    print(f"{target} qk_rope_kv_write {form}: {k.registers} regs, temp {res.temp_bytes} B")
