"""GPU compile gate of the Mamba-2 decode step (`ssd_state_update`), deviceless, for an H200.

At realistic decode shapes (Mamba-2 2.7B: H=80 heads of P=64, N=128, one group; a Nemotron-H
like layer: H=128, G=8; N=256; and non-power-of-two P=80, N=96), with z, D, dt_bias, softplus
and state_indices, the cache donated to the step: the compile must pass with XLA's
register-spill switch on (ptxas: no spill, no stack), be ONE launch (the kernel reads the
bf16/f32 inputs itself: no conversion kernels), alias exactly the cache's bytes, and need no
temp buffer beyond 64 KiB (the result `y` is an output, not temp). A cache past 4 GiB is
addressed with 64-bit offsets.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest

from jaxarena import gpu_aot
from pallas_kernels import ssd_state_update

F32, BF16 = jnp.float32, jnp.bfloat16
KIB = 1 << 10

# (slots S, rows Bt, H, P, G, N, cache dtype)
SHAPES = [
    (256, 256, 80, 64, 1, 128, F32),
    (512, 256, 128, 64, 8, 128, BF16),
    (64, 64, 32, 64, 1, 256, F32),
    (64, 32, 24, 80, 2, 96, F32),
]


@functools.cache
def _compile(shape, target):
    S, Bt, H, P, G, N, sdt = shape
    sds = jax.ShapeDtypeStruct
    args = (sds((S, H, P, N), sdt), sds((Bt, H, P), BF16), sds((Bt, H), BF16), sds((H,), F32),
            sds((Bt, G, N), BF16), sds((Bt, G, N), BF16), sds((H,), F32), sds((Bt, H, P), BF16),
            sds((H,), F32), sds((Bt,), jnp.int32))  # fmt: skip

    def step(state, x, dt, A, B, C, D, z, dt_bias, idx):
        return ssd_state_update(state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                                dt_softplus=True, state_indices=idx, interpret=False)  # fmt: skip

    return gpu_aot.compile_for_gpu(
        step, *args, target=target, donate_argnums=0, no_spills=True, dump_dir=True
    )


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "S{}-B{}-H{}-P{}-G{}-N{}".format(*s))
def test_state_update_compiles_in_place_without_spills(h200, shape):
    S, Bt, H, P, G, N, sdt = shape
    res = _compile(shape, h200)
    kernels = {k.name: k for k in res.pallas_kernels}
    assert set(kernels) == {"ssd_state_update"}
    k = kernels["ssd_state_update"]
    assert (k.spill_store_bytes, k.spill_load_bytes, k.stack_bytes) == (0, 0, 0), k
    assert res.launches == 1  # no conversion or copy kernels around it
    cache_bytes = S * H * P * N * jnp.dtype(sdt).itemsize
    assert res.alias_bytes == cache_bytes  # the cache, and only the cache, in place
    assert res.temp_bytes <= 64 * KIB
    print(f"ssd_state_update {shape[:-1]} {jnp.dtype(sdt).name}: {k.registers} registers, "
          f"temp {res.temp_bytes} B, alias {res.alias_bytes} B")  # fmt: skip


_STATE_PTR = re.compile(r"tt\.addptr [^\n]*?: tensor<16x128x!tt\.ptr<f32>>, tensor<16x128x(i\d+)>")


@pytest.mark.parametrize("slots", [64, 4096])
def test_cache_offsets_past_2gib(h200, slots, capfd, monkeypatch):
    """A 16 GiB f32 cache (4096 slots of H=128, P=64, N=128): the tile offsets of the state
    loads and stores are formed in 64 bits (Pallas does so for arrays of 2^32 bytes or more),
    so `slot * H * P * N` cannot wrap; a 256 MiB cache keeps int32 offsets. Lowering only."""
    from jax.experimental import pallas as pl

    H, P, N, Bt = 128, 64, 128, 8
    sds = jax.ShapeDtypeStruct
    args = gpu_aot.on_gpu(
        (sds((slots, H, P, N), F32), sds((Bt, H, P), BF16), sds((Bt, H), F32), sds((H,), F32),
         sds((Bt, 1, N), BF16), sds((Bt, 1, N), BF16), sds((Bt,), jnp.int32)),
        h200,
    )  # fmt: skip
    monkeypatch.setattr(pl, "pallas_call", functools.partial(pl.pallas_call, debug=True))
    step = jax.jit(
        lambda st, x, dt, A, B, C, idx: ssd_state_update(
            st, x, dt, A, B, C, state_indices=idx, interpret=False
        )
    )
    capfd.readouterr()
    with gpu_aot.abstract_gpu(h200):
        step.trace(*args).lower()
    widths = _STATE_PTR.findall(capfd.readouterr().out)
    assert len(widths) == 2  # the tile's load and its store
    assert set(widths) == ({"i64"} if slots * H * P * N * 4 >= 2**32 else {"i32"})
