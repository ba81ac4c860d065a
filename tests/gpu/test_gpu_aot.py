"""GPU compile gate without a GPU (`jaxarena.gpu_aot`, issue 12), and the in-place arena forms.

Every kernel is compiled for an H200 (sm_90a) and a B200 (sm_100a) on this CPU machine by
deviceless ahead-of-time compilation, at the issue's realistic shapes, with XLA's register
spill switch on (a spill fails the compile). The in-place FP8 form's GPU footprint is asserted:
no temp beyond 1 MiB, no growth with the shapes, the whole arena aliased. The parsers of the
harness are checked against hand-written dumps. When compile tests skip or fail: the gate's one
rule in tests/gpu/conftest.py.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest

from jaxarena import ArenaPlan, Levers, ModelConfig, Target, gpu_aot
from jaxarena.gpu_aot import compile_for_gpu
from pallas_kernels import (
    fp8_block_quant,
    fp8_block_quant_into,
    splitk_decode_attention,
    splitk_decode_attention_into,
)
from pallas_kernels.fp8_block_quant import fp8_silu_mul_quant, fp8_silu_mul_quant_into
from pallas_kernels.fp8_block_quant.inplace import quantize_inplace

S = jax.ShapeDtypeStruct
BF16, F32, I32, U8 = jnp.bfloat16, jnp.float32, jnp.int32, jnp.uint8
TARGETS = ("h200", "b200")
MIB, KIB = 1 << 20, 1 << 10


def _fp8_plan(m: int, k: int, *, block: int = 128, filler: int = 0) -> ArenaPlan:
    """The three FP8 regions sized for [m, k] (plus slack), after an optional filler region."""
    rows, nb = -(-m // 16) * 16, -(-k // block)
    sizes = {"filler": filler} if filler else {}
    sizes |= {"fp8_act": rows * k + 300, "fp8_act_scale": rows * nb * 4 + 20, "other": 1000,
              "fp8_act_scale_kmajor": nb * rows * 4 + 8}  # fmt: skip
    return ArenaPlan.sequential(sizes)


def _bind(into, plan, **kw):
    return lambda arena, *rest: into(arena, plan, *rest, **kw)


# -- the harness' parsers, on hand-written dumps --------------------------------------------------

THUNKS = """\
001: kCopy         [source       | next=002 (1)] kCopy
002: kCustomKernel [prev=001 (1) | next=003 (1)] loop_add_fusion grid: [16, 1, 1] threads: [128, 1, 1]  shared_memory: 0 bytes
003: kWhile        [prev=002 (1) | next=007 (1)]
condition:
    004: kCustomKernel [source | sink] loop_compare_fusion grid: [1, 1, 1] threads: [1, 1, 1]  shared_memory: 0 bytes
  body:
    005: kCustomKernel [source       | next=006 (1)] ssd_chunk grid: [32, 64, 1] threads: [128, 1, 1]  shared_memory: 81920 bytes
    006: kMemset32BitValue [prev=005 (1) | sink] kMemset32BitValue
007: kCustomKernel [prev=003 (1) | sink] ssd_output grid: [32, 64, 1] threads: [128, 1, 1]  shared_memory: 65536 bytes
"""  # noqa: E501


def test_thunk_sequence_parse_and_launch_count():
    top = gpu_aot.parse_thunk_sequence(THUNKS)
    assert [t.kind for t in top] == ["kCopy", "kCustomKernel", "kWhile", "kCustomKernel"]
    loop = top[2]
    assert [t.name for t in loop.sections["condition"]] == ["loop_compare_fusion"]
    assert [t.kind for t in loop.sections["body"]] == ["kCustomKernel", "kMemset32BitValue"]
    chunk = loop.sections["body"][0]
    assert (chunk.name, chunk.grid, chunk.threads, chunk.shared_memory_bytes) == (
        "ssd_chunk", (32, 64, 1), (128, 1, 1), 81920)  # fmt: skip
    # Static: 3 top-level launches + 1 condition + 2 body = 6.
    assert gpu_aot.count_launches(top, per_call=False) == 6
    assert gpu_aot.count_launches(top) is None  # trip count unknown
    loop.trip_count = 32
    # Per call: 3 + 32 bodies of 2 + 33 condition checks = 100.
    assert gpu_aot.count_launches(top) == 3 + 32 * 2 + 33


PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'fp8_block_quant' for 'sm_90a'
ptxas info    : Function properties for fp8_block_quant
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 91 registers, used 1 barriers
ptxas info    : Compile time = 29.507 ms
ptxas info    : Compiling entry function 'ssd_output' for 'sm_90a'
ptxas info    : Function properties for ssd_output
    6472 bytes stack frame, 7336 bytes spill stores, 20228 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 6472 bytes cumulative stack size
"""


def test_ptxas_parse():
    k = gpu_aot.parse_ptxas_output(PTXAS)
    assert [(x.name, x.registers, x.spill_store_bytes, x.spill_load_bytes, x.stack_bytes)
            for x in k] == [("fp8_block_quant", 91, 0, 0, 0), ("ssd_output", 32, 7336, 20228, 6472)]  # fmt: skip


def test_a_dump_without_the_pallas_kernels_ptx_is_an_error(tmp_path):
    # jax >= 0.11 dumps no PTX unless asked (xla_dump_emitter_re): the analysis must say so
    # instead of reporting no Pallas kernels (and so nothing to check for spills).
    (tmp_path / "module_0001.jit_f.thunk_sequence.txt").write_text(THUNKS)
    hlo = '%p = custom-call(%x), custom_call_target="__gpu$xla.gpu.triton", backend_config={name = "ssd_chunk"}'
    r = gpu_aot.GpuCompiled(None, "h200", 0, 0, 0, 0, hlo, 0.0)
    with pytest.raises(RuntimeError, match=r"no PTX for the Pallas kernels \['ssd_chunk'\]"):
        gpu_aot.analyze_dump(r, str(tmp_path))
    assert r.launches_static == 6  # the thunks were read before the check


def test_while_trip_count_reaches_the_launch_count(target):
    # An XLA while loop of 5 iterations: its thunk gets trip_count 5 from the optimized HLO,
    # and the per-call count multiplies its body out.
    def f(x):
        return jax.lax.fori_loop(0, 5, lambda i, v: jnp.sin(v) * v + i, x)

    r = compile_for_gpu(f, S((1024,), F32), target=target, dump_dir=True)
    loops = [t for t in gpu_aot.walk(r.thunks) if t.kind == "kWhile"]
    assert [t.trip_count for t in loops] == [5]
    body = gpu_aot.count_launches(loops[0].sections["body"], per_call=False)
    cond = gpu_aot.count_launches(loops[0].sections.get("condition", []), per_call=False)
    assert body >= 1
    assert r.launches - r.launches_static == 4 * body + 5 * cond


# -- the compile gate: realistic shapes, spill switch on -------------------------------------------

M, K = 4096, 7168  # FP8: DeepSeek-V3 hidden size, a 4k-token prefill
SPLITK = dict(b=8, ctx=32768, hq=64, hkv=8, d=128, page=16)


def _fp8_args():
    plan = _fp8_plan(M, K)
    return plan, S(plan.arena_shape, U8), S((M, K), BF16)


def test_fp8_block_quant_compiles(target):
    r = compile_for_gpu(lambda x: fp8_block_quant(x, interpret=False), S((M, K), BF16),
                        target=target, dump_dir=True)  # fmt: skip
    assert [k.spill_store_bytes for k in r.pallas_kernels] == [0]
    assert r.launches == 1


def _splitk_args():
    b, ctx, hq, hkv, d, page = SPLITK.values()
    pages = ctx // page
    kv = S((b * pages, page, hkv, d), BF16)
    return (S((b, hq, d), BF16), kv, kv, S((b, pages), I32), S((b,), I32))


SPLITK_KW = dict(levers=Levers(), target=Target.preset("hopper"), interpret=False)


def test_splitk_decode_attention_compiles(target):
    r = compile_for_gpu(functools.partial(splitk_decode_attention, **SPLITK_KW),
                        *_splitk_args(), target=target, dump_dir=True)  # fmt: skip
    names = sorted(k.name for k in r.pallas_kernels)
    assert names == ["splitk_combine", "splitk_decode_attention"], names
    assert [k.spill_store_bytes for k in r.pallas_kernels] == [0, 0]


def test_splitk_decode_attention_into_compiles(target):
    b, _, hq, _, d, _ = SPLITK.values()
    plan = ArenaPlan.sequential(
        {"attn_output": b * hq * d * 2, "splitk_workspace": b * hq * 16 * (d + 2) * 4}
    )
    r = compile_for_gpu(_bind(splitk_decode_attention_into, plan, **SPLITK_KW),
                        S(plan.arena_shape, U8), *_splitk_args(), target=target,
                        donate_argnums=0)  # fmt: skip
    assert r.alias_bytes == plan.total_bytes


def test_hybrid_decode_step_compiles(h200):
    """The tiny hybrid model's decode step on its arena (the e2e test's limits), for H200.

    H200 only: the B200 compile of the same HLO differs only in ptxas' target, which the
    per-kernel compiles above already cover for B200, and this compile is the gate's slowest
    (about 40 s of CPU).

    Bound on temp: less than the arena, so XLA never copies the whole arena (a stale view kept
    alive past a write would); alias covers the arena and the caches (both donated). The
    launch count is printed (issue 12 asks for the figure; -s shows it).
    """
    target = h200
    from jaxarena.models.reference.hybrid import HybridModel, init_caches, init_params

    cfg = ModelConfig.preset("tiny-hybrid")
    batch, max_seq, block = 4, 64, 16
    model = HybridModel.create(cfg, max_batch_tokens=64, max_seq_len=max_seq,
                               kv_block_size=block, max_batch_size=batch,
                               target=Target.preset("hopper"), interpret=False)  # fmt: skip
    params = jax.eval_shape(lambda: init_params(cfg, seed=0))
    caches = jax.eval_shape(lambda: init_caches(
        cfg, num_blocks=batch * (max_seq // block), block_size=block, max_batch_size=batch))  # fmt: skip
    v = S((batch,), I32)
    r = compile_for_gpu(jax.jit(model.decode_step, donate_argnums=(1, 2)), params,
                        S(model.plan.arena_shape, U8), caches, v, v,
                        S((batch, max_seq // block), I32), v, target=target, dump_dir=True)  # fmt: skip
    cache_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(caches))
    assert r.alias_bytes >= model.plan.total_bytes + cache_bytes
    assert r.temp_bytes < model.plan.total_bytes
    assert r.pallas_kernels and r.kernels
    assert [k.name for k in r.kernels if k.spill_store_bytes] == []
    print(f"\n{target} hybrid decode step: temp {r.temp_bytes:,} B, {r.launches} launches")


# -- the in-place FP8 forms ------------------------------------------------------------------------


def _inplace_footprint(m: int, k: int, target: str, *, fused: bool = False, **kw):
    plan = _fp8_plan(m, k, block=kw.get("block_size", 128))
    x = S((m, k), BF16)
    if fused:
        fn, args = _bind(fp8_silu_mul_quant_into, plan, regions=FP8_REGIONS, interpret=False,
                         **kw), (x, x)  # fmt: skip
    else:
        fn, args = _bind(fp8_block_quant_into, plan, interpret=False, **kw), (x,)
    r = compile_for_gpu(fn, S(plan.arena_shape, U8), *args, target=target, donate_argnums=0,
                        dump_dir=True)  # fmt: skip
    return plan, r


FP8_REGIONS = ("fp8_act", "fp8_act_scale", "fp8_act_scale_kmajor")


@pytest.mark.parametrize(
    "kw, launches",
    [
        (dict(), 1),
        (dict(fused=True), 1),
        (dict(scale_format="ue8m0", scale_layout="packed_ue8m0"), 2),  # + the packing pass
    ],
    ids=["plain", "silu_mul", "packed_ue8m0"],
)
def test_inplace_fp8_footprint(target, kw, launches):
    """At most 1 MiB of GPU temp at M=4096, K=7168, at most 64 KiB more when M grows 4x
    (1024 -> 4096), the whole arena aliased, one launch (two with packed scales), no spill.

    Why these bounds hold: the kernel stores straight into the aliased arena and reads x (gate,
    up) in place (no padded copy); the only temporaries XLA may add are fixed-size (none
    today: 0 B). The copy-in/copy-out form this replaced needed 7.8 MB / 30.3 MB here (the
    kernel's outputs kept as temps and copied with dynamic-update-slices, 6 launches).
    """
    plan_s, small = _inplace_footprint(1024, K, target, **kw)
    plan, big = _inplace_footprint(M, K, target, **kw)
    assert big.temp_bytes <= MIB
    assert big.temp_bytes - small.temp_bytes <= 64 * KIB
    assert (big.alias_bytes, small.alias_bytes) == (plan.total_bytes, plan_s.total_bytes)
    assert big.launches == launches
    assert len(big.pallas_kernels) == launches
    assert all(k.spill_store_bytes == 0 for k in big.pallas_kernels)
    print(f"\n{target} fp8 into {kw}: temp {big.temp_bytes} B, launches {big.launches}, "
          f"registers {[k.registers for k in big.pallas_kernels]}")  # fmt: skip


@pytest.mark.parametrize("block_size", [32, 64, 128])
@pytest.mark.parametrize(
    "fn, kw",
    [
        (fp8_block_quant, dict(scale_layout="col")),
        (fp8_silu_mul_quant, dict()),
        (fp8_block_quant, dict(scale_format="ue8m0", scale_layout="packed_ue8m0")),
    ],
    ids=["col", "silu_mul", "packed_ue8m0"],
)
def test_fp8_standalone_features_compile_without_spills(h200, block_size, fn, kw):
    """Issue 15's features in the standalone form, for H200 with the spill switch on."""
    n_in = 2 if fn is fp8_silu_mul_quant else 1
    r = compile_for_gpu(functools.partial(fn, block_size=block_size, interpret=False, **kw),
                        *[S((M, K), BF16)] * n_in, target=h200, dump_dir=True)  # fmt: skip
    assert [k.spill_store_bytes for k in r.pallas_kernels] == [0]


@pytest.mark.parametrize("block_size", [32, 64])
def test_inplace_fp8_group_sizes_compile_without_spills(h200, block_size):
    _, r = _inplace_footprint(M, K, h200, block_size=block_size, fused=True)
    assert r.temp_bytes <= MIB and r.launches == 1
    assert [k.spill_store_bytes for k in r.pallas_kernels] == [0]


def test_inplace_fp8_rejects_unaligned_k():
    plan = _fp8_plan(16, 302)
    with pytest.raises(NotImplementedError, match="K % 4"):
        fp8_block_quant_into(S(plan.arena_shape, U8), plan, S((16, 302), BF16))


_ADDPTR = re.compile(r"tt\.addptr %\S+, %\S+ : tensor<[^>]*!tt\.ptr<i32>>, tensor<[\dx]+(i\d+)>")


@pytest.mark.parametrize("filler_gib, variant", [(3, "plain"), (5, "plain"), (3, "fused_packed")])
def test_inplace_fp8_offsets_past_2gib(h200, filler_gib, variant, capfd):
    """Regions past 2^31 bytes: the Triton IR addresses the arena in 4-byte words, with int32
    offsets only while the arena has fewer than 2^31 words, 64-bit beyond.

    Pallas picks int32 element offsets for arrays up to 2^32 BYTES, and Triton adds them to
    pointers as signed values: a byte view of a 3 GiB arena would reach bytes past 2^31 through
    negative offsets. A word view of the same arena has at most 2^30 words, and a 5 GiB arena
    gets 64-bit offsets. Lowering only (nothing allocated; no GPU needed). `fused_packed`:
    the SiLU-and-mul kernel (two input pointers) and the UE8M0 packing pass (reads and writes
    the arena words).
    """
    m, k = 64, 512
    plan = _fp8_plan(m, k, filler=filler_gib << 30)
    offsets = tuple(plan.regions[n].offset_bytes for n in
                    ("fp8_act", "fp8_act_scale", "fp8_act_scale_kmajor"))  # fmt: skip
    assert min(offsets) >= 2**31
    arena, x = gpu_aot.on_gpu((S(plan.arena_shape, U8), S((m, k), BF16)))
    fused = variant == "fused_packed"
    fn = jax.jit(functools.partial(quantize_inplace, offsets=offsets, rows=m, block_size=128,
                                   scale_format="ue8m0" if fused else "f32", packed=fused,
                                   interpret=False, debug=True))  # fmt: skip
    with gpu_aot.abstract_gpu(h200):
        (fn.trace(arena, x, x) if fused else fn.trace(arena, x)).lower()
    ir = capfd.readouterr().out
    pointee = set(re.findall(r"tt\.addptr [^:]*: tensor<[^>]*!tt\.ptr<(\w+)>>", ir))
    assert pointee == {"bf16", "i32"}, pointee  # x, and the arena as words (no byte pointer)
    widths = set(_ADDPTR.findall(ir))
    expected = "i64" if plan.total_bytes > 2**32 else "i32"
    assert widths == {expected}, (widths, plan.total_bytes)
    # With int32 offsets the largest word offset, (total_bytes - 4) / 4, stays below 2^31.
    assert expected == "i64" or (plan.total_bytes - 4) // 4 < 2**31
