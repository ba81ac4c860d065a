"""GPU compile gate of the SSD scan with every issue 15 option on (z gating, D [H, P],
dt_limit, bf16 final states), deviceless for an H200 (`jaxarena.gpu_aot`).

At the realistic layer of tests/gpu/test_ssd_gpu.py (H=64, P=64, N=128, G=8, S=4 sequences
with initial states, bf16 x/B/C/z, T=2048) the arena form must compile with XLA's
register-spill switch on and ptxas reporting no spill and no stack, run no XLA loop, alias the
whole arena and keep its temp within 1 MiB: the options add operands, not buffers.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxarena import ArenaPlan, gpu_aot
from jaxarena.workspaces import ssd_scratch_layout
from pallas_kernels.ssd_chunked_scan import ssd_chunked_scan_into

H, P, N, G, S, T = 64, 64, 128, 8, 4, 2048
MIB = 1 << 20


@functools.cache
def _plan() -> ArenaPlan:
    scratch = sum(n for _, n in ssd_scratch_layout(H, G, T).values())
    return ArenaPlan.sequential({"before": MIB, "ssd_scratch": scratch, "after": MIB})


def test_every_option_compiles_in_place_without_spills(h200):
    plan = _plan()
    sds = jax.ShapeDtypeStruct
    f32, bf16 = jnp.float32, jnp.bfloat16
    args = dict(
        x=sds((T, H, P), bf16), dt=sds((T, H), f32), A=sds((H,), f32), B=sds((T, G, N), bf16),
        C=sds((T, G, N), bf16), D=sds((H, P), f32), z=sds((T, H, P), bf16),
        dt_bias=sds((H,), f32), initial_states=sds((S, H, P, N), f32),
        cu_seqlens=sds((S + 1,), jnp.int32),
    )  # fmt: skip

    def step(arena, x, dt, A, B, C, **kw):
        return ssd_chunked_scan_into(arena, plan, x, dt, A, B, C, dt_softplus=True,
                                     dt_limit=(0.001, 0.1), state_dtype=bf16,
                                     interpret=False, **kw)  # fmt: skip

    res = gpu_aot.compile_for_gpu(
        step, sds(plan.arena_shape, jnp.uint8), **args, target=h200, donate_argnums=0,
        no_spills=True, dump_dir=True,
    )  # fmt: skip
    assert res.pallas_kernels
    for k in res.pallas_kernels:
        assert (k.spill_store_bytes, k.spill_load_bytes, k.stack_bytes) == (0, 0, 0), k
    assert res.launches == res.launches_static  # no XLA loop
    assert res.alias_bytes == plan.total_bytes
    assert res.temp_bytes <= MIB
    print("SSD all options: " + ", ".join(f"{k.name} {k.registers} regs" for k in
          res.pallas_kernels) + f"; temp {res.temp_bytes} B, {res.launches} launches")  # fmt: skip
