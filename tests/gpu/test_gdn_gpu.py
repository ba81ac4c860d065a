"""GPU compile gate of the Gated DeltaNet kernels, deviceless (`jaxarena.gpu_aot`).

Chunked prefill, arena form, at a Qwen3-Next linear-attention layer (16 key heads, 32 value
heads, 128x128, bf16 q/k/v, 4 packed sequences with initial states, q/k L2 norm), the scratch
between two other regions, at T = 2048 and 8192 tokens: every Pallas kernel compiles with
XLA's register-spill switch on (ptxas: no spill, no stack); the launches per call are the same
at both lengths (no per-chunk XLA loop); the whole arena is aliased. The decode update
(`gdn_state_update`, 256 slots, 128 rows) is one launch, in place (the cache aliased), without
spills.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxarena import ArenaPlan, gpu_aot
from jaxarena.workspaces import gdn_fla_scratch_layout
from pallas_kernels.gdn_chunked import GDN_REGION, gdn_chunked_into
from pallas_kernels.gdn_state_update import gdn_state_update

H, HV, K, S = 16, 32, 128, 4
LENGTHS = (2048, 8192)
KERNELS = {"gdn_chunk_prep", "gdn_chunk_state", "gdn_chunk_output"}
MIB = 1 << 20
BF16, F32 = jnp.bfloat16, jnp.float32


@functools.cache
def _compile(T: int, target: str, S: int = S):
    scratch = sum(n for _, n in gdn_fla_scratch_layout(HV, T).values())
    plan = ArenaPlan.sequential({"before": MIB, GDN_REGION: scratch, "after": MIB})
    sds = jax.ShapeDtypeStruct
    args = (sds((T, H, K), BF16), sds((T, H, K), BF16), sds((T, HV, K), BF16),
            sds((T, HV), F32), sds((T, HV), F32), sds((S + 1,), jnp.int32),
            sds((S, HV, K, K), F32))  # fmt: skip

    def step(arena, q, k, v, g, beta, cu, h0):
        return gdn_chunked_into(arena, plan, q, k, v, g, beta, cu_seqlens=cu, initial_states=h0,
                                use_qk_l2norm=True, interpret=False)  # fmt: skip

    res = gpu_aot.compile_for_gpu(step, sds(plan.arena_shape, jnp.uint8), *args, target=target,
                                  donate_argnums=0, no_spills=True, dump_dir=True)  # fmt: skip
    return plan, res


def test_chunked_arena_form_compiles_without_spills_and_flat_in_T(target):
    launches = []
    for T in LENGTHS:
        plan, res = _compile(T, target)
        kernels = {k.name: k for k in res.pallas_kernels}
        assert set(kernels) == KERNELS, set(kernels)
        for k in kernels.values():
            assert (k.spill_store_bytes, k.spill_load_bytes, k.stack_bytes) == (0, 0, 0), k
        assert res.alias_bytes == plan.total_bytes
        assert res.launches is not None
        launches.append(res.launches)
        print(
            f"{target} T={T}: launches {res.launches}, temp {res.temp_bytes} B, "
            + ", ".join(f"{k.name} {k.registers} regs" for k in kernels.values())
        )
    assert launches[0] == launches[1], launches


def test_chunked_arena_form_in_rounds_compiles_in_place(target):
    """257 sequences (a batch of 256 and its padding sequence) in T = 2048 tokens may need
    (T + 63 S) // 64 = 284 chunk slots, the region holds 48: the kernels run in a while loop of
    rounds. The same three kernels without spills, the arena aliased, and the temp under
    1 MiB (measured 7.5 KB: the call's chunk map, int32[4, 288], and the loop's scalars; o
    and the final states are outputs), where a copy of the 126 MB scratch or of the arena
    would need more. Per round: the 3 kernels, 3 small fusions (the round's slice of the
    chunk map, its slot count, the counter) and the loop's compare."""
    T = 2048
    plan, res = _compile(T, target, 257)
    _, one = _compile(T, target)
    kernels = {k.name: k for k in res.pallas_kernels}
    assert set(kernels) == KERNELS, set(kernels)
    for k in kernels.values():
        assert (k.spill_store_bytes, k.spill_load_bytes, k.stack_bytes) == (0, 0, 0), k
    assert res.alias_bytes == plan.total_bytes
    assert res.temp_bytes < MIB, res.temp_bytes
    print(
        f"{target} T={T} S=257 (rounds): launches {res.launches} (thunks each once: "
        f"{res.launches_static}), temp {res.temp_bytes} B; S={S}: launches {one.launches}, "
        f"temp {one.temp_bytes} B"
    )


def test_state_update_is_one_launch_in_place_without_spills(target):
    slots, B = 256, 128
    sds = jax.ShapeDtypeStruct
    args = (
        sds((slots, HV, K, K), F32),
        sds((B, H, K), BF16),
        sds((B, H, K), BF16),
        sds((B, HV, K), BF16),
        sds((B, HV), F32),
        sds((B, HV), F32),
        sds((B,), jnp.int32),
    )

    def step(state, q, k, v, g, beta, idx):
        return gdn_state_update(state, q, k, v, g, beta, state_indices=idx, use_qk_l2norm=True,
                                interpret=False)  # fmt: skip

    res = gpu_aot.compile_for_gpu(step, *args, target=target, donate_argnums=0, no_spills=True,
                                  dump_dir=True)  # fmt: skip
    (k,) = res.pallas_kernels
    assert k.name == "gdn_state_update"
    assert (k.spill_store_bytes, k.spill_load_bytes, k.stack_bytes) == (0, 0, 0), k
    assert res.launches == 1
    assert res.alias_bytes == slots * HV * K * K * 4
    print(f"{target} gdn_state_update: {k.registers} regs, temp {res.temp_bytes} B")
