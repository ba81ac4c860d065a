"""Split-K decode attention compiled for an H200 (and a B200) without a GPU: in place in the
arena, no register spills, for every option (issues 12 and 15).

Deviceless ahead-of-time compilation (`jaxarena.gpu_aot`) with XLA's register-spill switch on:
a spill fails the compile. Issue 12's shape: B=8 sequences of 32k tokens in pages of 16, GQA
64:8, D=128, bf16, the hopper target's split policy (5 splits).

The temp bound: the arena form runs two kernels on the aliased arena (attention pass, combine
pass); every intermediate lives in the arena's `splitk_workspace` region, so XLA needs no
buffer beside the arena and its outputs. 1 MiB (issue 12's bound) leaves room for XLA's small
scratch; the growth bound (64 KiB when B and the context grow 4x) says nothing scales with the
shapes. When these tests skip or fail: the gate's one rule in tests/gpu/conftest.py.
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import pytest

from jaxarena import ArenaPlan, Levers, Target, gpu_aot
from pallas_kernels.splitk_decode_attention import (
    splitk_decode_attention,
    splitk_decode_attention_into,
)
from pallas_kernels.splitk_decode_attention.ops import _run

S = jax.ShapeDtypeStruct
BF16, F32, I32, U8 = jnp.bfloat16, jnp.float32, jnp.int32, jnp.uint8
MIB, KIB = 1 << 20, 1 << 10
POLICY = dict(levers=Levers(), target=Target.preset("hopper"), interpret=False)


def _case(b=8, ctx=32768, hq=64, hkv=8, d=128, dv=None, page=16, kv=BF16, latent=False,
          sinks=False, filler=0, **opts):  # fmt: skip
    """(plan, args, fn): the arena form at these shapes, every array argument abstract."""
    dv = dv or d
    pages = ctx // page
    k = S((b * pages, page, hkv, d), kv)
    v = None if latent else S((b * pages, page, hkv, dv), kv)
    args = [S((b, hq, d), BF16), k, v, S((b, pages), I32), S((b,), I32)]
    names = []
    if sinks:
        names.append("sinks")
        args.append(S((hq,), F32))
    if kv == jnp.float8_e4m3fn:
        names += ["k_scale", "v_scale"]
        args += [S((hkv,), F32)] * 2
    if latent:
        opts["v_head_dim"] = dv
    sizes = {"filler": filler} if filler else {}
    sizes |= {"attn_output": b * hq * dv * 2, "splitk_workspace": b * hq * 16 * (dv + 2) * 4}
    plan = ArenaPlan.sequential(sizes)

    def fn(arena, q, k, v, bt, sl, *extra):
        kw = dict(zip(names, extra, strict=True))
        return splitk_decode_attention_into(arena, plan, q, k, v, bt, sl, **POLICY, **opts, **kw)

    return plan, [S(plan.arena_shape, U8), *args], fn


def _compile(target, fn, args):
    return gpu_aot.compile_for_gpu(fn, *args, target=target, no_spills=True, dump_dir=True,
                                   donate_argnums=0)  # fmt: skip


def test_into_is_in_place_and_flat(target):
    """Before (main at 1c88d29, H200): temp 5,591,040 B at these shapes and 22,364,160 B at 4x
    (the workspace region viewed out and copied back), 9 launches. Now: no temp, 2 launches
    (attention + combine), the whole arena aliased."""
    temps = []
    for scale in (1, 4):
        plan, args, fn = _case(b=8 * scale, ctx=32768 * scale)
        r = _compile(target, fn, args)
        assert r.alias_bytes == plan.total_bytes
        assert r.temp_bytes <= MIB, r.temp_bytes
        assert r.launches == 2, r.launches
        assert {k.name for k in r.pallas_kernels} == {"splitk_decode_attention", "splitk_combine"}
        temps.append(r.temp_bytes)
    assert temps[1] - temps[0] <= 64 * KIB, temps


def test_standalone_compiles_without_spills(h200):
    """The standalone form at issue 12's shape: the attention pass and the combine pass, no
    spill; at most one more launch (XLA may zero or copy the output beside them)."""
    q, kv = S((8, 64, 128), BF16), S((8 * 2048, 16, 8, 128), BF16)
    r = gpu_aot.compile_for_gpu(
        functools.partial(splitk_decode_attention, **POLICY), q, kv, kv, S((8, 2048), I32),
        S((8,), I32), target=h200, no_spills=True, dump_dir=True,
    )  # fmt: skip
    assert r.launches is not None and 2 <= r.launches <= 3, r.launches
    names = sorted(k.name for k in r.pallas_kernels)
    assert names == ["splitk_combine", "splitk_decode_attention"], names
    assert [k.spill_store_bytes for k in r.pallas_kernels] == [0, 0]


FEATURES = {
    # name: _case keyword arguments (issue 12's shapes unless said)
    "one_split": dict(num_splits=1),
    "window_4096": dict(window_size=4096),
    "sinks_lse": dict(sinks=True, return_lse=True),
    "softcap_30": dict(softcap=30.0),
    "fp8_kv_per_head": dict(kv=jnp.float8_e4m3fn),
    "d80": dict(hq=32, d=80),
    "d192": dict(hq=32, d=192),
    "d256": dict(hq=16, d=256),
    "mla_latent_576_512_16_heads": dict(hq=16, hkv=1, d=576, dv=512, page=64, latent=True),
    "mla_latent_576_512_128_heads": dict(hq=128, hkv=1, d=576, dv=512, page=64, latent=True),
}


@pytest.mark.parametrize("name", list(FEATURES))
def test_every_option_compiles_in_place_without_spills(h200, name):
    plan, args, fn = _case(**FEATURES[name])
    r = _compile(h200, fn, args)
    assert r.alias_bytes == plan.total_bytes
    assert r.temp_bytes <= MIB, r.temp_bytes
    # One split: the attention pass writes the output itself, no combine pass.
    expected = ["splitk_decode_attention"] + ([] if name == "one_split" else ["splitk_combine"])
    assert sorted(k.name for k in r.pallas_kernels) == sorted(expected), r.pallas_kernels
    assert [k.name for k in r.pallas_kernels if k.spill_store_bytes] == [], r.pallas_kernels


_ADDPTR = re.compile(r"tt\.addptr %\S+, %\S+ : tensor<[^>]*!tt\.ptr<i32>>, tensor<[\dx]+(i\d+)>")


@pytest.mark.parametrize("filler_gib", [3, 5])
def test_offsets_past_2gib(h200, filler_gib, capfd):
    """Regions past 2^31 bytes: both kernels address the arena as 32-bit words, so a 3 GiB
    arena has fewer than 2^31 words (int32 offsets are safe) and a 5 GiB one gets 64-bit
    offsets (Pallas switches past 2^32 bytes). Lowering only: nothing is allocated."""
    b, hq, hkv, d, pages = 2, 16, 2, 64, 8
    plan = ArenaPlan.sequential(
        {"filler": filler_gib << 30, "attn_output": b * hq * d * 2,
         "splitk_workspace": b * hq * 4 * (d + 2) * 4}
    )  # fmt: skip
    offsets = tuple(plan.regions[n].offset_bytes for n in ("splitk_workspace", "attn_output"))
    assert min(offsets) >= 2**31
    kv = S((b * pages, 16, hkv, d), BF16)
    arena, q, k, v, bt, sl = gpu_aot.on_gpu(
        (S(plan.arena_shape, U8), S((b, hq, d), BF16), kv, kv, S((b, pages), I32), S((b,), I32))
    )

    def fn(arena, q, k, v, bt, sl):
        return _run(q, k, v, bt, sl, arena, splits=4, d_v=d, sm_scale=None, softcap=None,
                    window_size=None, sinks=None, k_scale=None, v_scale=None,
                    return_lse=False, interpret=False, arena_offsets=offsets, debug=True)[0]  # fmt: skip

    with gpu_aot.abstract_gpu(h200):
        jax.jit(fn).trace(arena, q, k, v, bt, sl).lower()
    ir = capfd.readouterr().out
    widths = set(_ADDPTR.findall(ir))
    expected = "i64" if plan.total_bytes > 2**32 else "i32"
    assert widths == {expected}, (widths, plan.total_bytes)
    assert expected == "i64" or (plan.total_bytes - 4) // 4 < 2**31
