"""GPU figures without a GPU: compiles each kernel (and the hybrid decode step) for an H200 or
B200 on this CPU machine and prints temp/alias bytes, launches, registers and spills.

    JAX_PLATFORMS=cpu python benchmarks/gpu_compile_figures.py [--target h200] [--only fp8 ssd]
        [--spill-check]

Needs the CUDA PJRT plugin at jaxlib's version (`pip install "jax[cuda13-local]"`) and ptxas.
Each case compiles once with the no-spill switch OFF and a dump (to read the registers and
spills of every kernel); `--spill-check` compiles again with the switch ON and reports whether
that compile succeeds (what the CI gate asserts). Shapes are the issue's realistic ones.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp

from jaxarena import ArenaPlan, Levers, ModelConfig, Target
from jaxarena.gpu_aot import RegisterSpillError, compile_for_gpu
from jaxarena.workspaces import ssd_scratch_layout

S = jax.ShapeDtypeStruct
BF16, F32, I32, U8 = jnp.bfloat16, jnp.float32, jnp.int32, jnp.uint8
MIB = 1 << 20


def _arena(sizes: dict[str, int]) -> tuple[ArenaPlan, S]:
    plan = ArenaPlan.sequential(sizes)
    return plan, S(plan.arena_shape, U8)


def _bind(into, plan, **kw):
    """`into(arena, plan, *rest, **kw)` as a function of `(arena, *rest)`."""
    return lambda arena, *rest: into(arena, plan, *rest, **kw)


def fp8_cases(m: int = 4096, k: int = 7168):
    from pallas_kernels.fp8_block_quant import (
        FFN_ACT_REGIONS,
        fp8_block_quant,
        fp8_block_quant_into,
        fp8_silu_mul_quant,
        fp8_silu_mul_quant_into,
    )

    x = S((m, k), BF16)
    yield f"fp8_block_quant M={m} K={k}", (lambda x: fp8_block_quant(x, interpret=False)), (x,), {}
    yield (f"fp8_silu_mul_quant M={m} I={k}",
           (lambda g, u: fp8_silu_mul_quant(g, u, interpret=False)), (x, x), {})  # fmt: skip
    rows, nb = -(-m // 16) * 16, -(-k // 128)
    sizes = {"q": rows * k, "scale": rows * nb * 4, "kmajor": nb * rows * 4}
    plan, arena = _arena({f"fp8_act{s}": n for s, n in zip(("", "_scale", "_scale_kmajor"),
                                                            sizes.values(), strict=True)})  # fmt: skip
    fn = _bind(fp8_block_quant_into, plan, interpret=False)
    yield f"fp8_block_quant_into M={m} K={k}", fn, (arena, x), {"donate_argnums": 0}
    fn = _bind(fp8_block_quant_into, plan, scale_format="ue8m0", scale_layout="packed_ue8m0",
               interpret=False)  # fmt: skip
    yield f"fp8_block_quant_into packed_ue8m0 M={m} K={k}", fn, (arena, x), {"donate_argnums": 0}
    plan, arena = _arena(dict(zip(FFN_ACT_REGIONS, sizes.values(), strict=True)))
    fn = _bind(fp8_silu_mul_quant_into, plan, interpret=False)
    yield f"fp8_silu_mul_quant_into M={m} I={k}", fn, (arena, x, x), {"donate_argnums": 0}


def splitk_cases(b: int = 8, ctx: int = 32768, hq: int = 64, hkv: int = 8, d: int = 128):
    from pallas_kernels.splitk_decode_attention import (
        splitk_decode_attention,
        splitk_decode_attention_into,
        splitk_num_splits,
    )

    page = 16
    pages_per_seq = ctx // page
    target, levers = Target.preset("hopper"), Levers()
    splits = splitk_num_splits(b, hq, levers=levers, target=target)
    args = (
        S((b, hq, d), BF16),
        S((b * pages_per_seq, page, hkv, d), BF16),
        S((b * pages_per_seq, page, hkv, d), BF16),
        S((b, pages_per_seq), I32),
        S((b,), I32),
    )
    kw = dict(levers=levers, target=target, interpret=False)
    name = f"B={b} ctx={ctx} GQA {hq}:{hkv} D={d} splits={splits}"
    yield (
        f"splitk_decode_attention {name}",
        functools.partial(splitk_decode_attention, **kw),
        args,
        {},
    )
    plan, arena = _arena(
        {"attn_output": b * hq * d * 2, "splitk_workspace": b * hq * 16 * (d + 2) * 4}
    )
    fn = _bind(splitk_decode_attention_into, plan, **kw)
    yield f"splitk_decode_attention_into {name}", fn, (arena, *args), {"donate_argnums": 0}


def ssd_cases(ts=(2048, 8192), h: int = 64, p: int = 64, n: int = 128, g: int = 8):
    from pallas_kernels import ssd_chunked_scan, ssd_chunked_scan_into

    for t in ts:
        args = (S((t, h, p), BF16), S((t, h), F32), S((h,), F32), S((t, g, n), BF16),
                S((t, g, n), BF16))  # fmt: skip
        name = f"T={t} H={h} P={p} N={n} G={g}"
        fn = functools.partial(ssd_chunked_scan, interpret=False)
        yield f"ssd_chunked_scan {name}", fn, args, {}
        nbytes = sum(nb for _, nb in ssd_scratch_layout(h, g, t).values())
        plan, arena = _arena({"ssd_scratch": nbytes})
        fn = _bind(ssd_chunked_scan_into, plan, interpret=False)
        yield f"ssd_chunked_scan_into {name}", fn, (arena, *args), {"donate_argnums": 0}


def hybrid_cases(batch: int = 4, max_seq: int = 64, block: int = 16):
    from jaxarena.models.reference.hybrid import (
        HybridModel,
        default_block_tables,
        init_caches,
        init_params,
    )

    cfg = ModelConfig.preset("tiny-hybrid")
    model = HybridModel.create(cfg, max_batch_tokens=64, max_seq_len=max_seq,
                               kv_block_size=block, max_batch_size=batch,
                               target=Target.preset("hopper"), interpret=False)  # fmt: skip
    params = jax.eval_shape(lambda: init_params(cfg, seed=0))
    caches = jax.eval_shape(
        lambda: init_caches(
            cfg, num_blocks=batch * (max_seq // block), block_size=block, max_batch_size=batch
        )  # fmt: skip
    )
    tables = S(default_block_tables(batch, max_seq // block).shape, I32)
    v = S((batch,), I32)
    step = jax.jit(model.decode_step, donate_argnums=(1, 2))
    arena = S(model.plan.arena_shape, U8)
    yield (f"hybrid decode_step tiny-hybrid B={batch} (arena {model.plan.total_bytes:,} B)",
           step, (params, arena, caches, v, v, tables, v), {})  # fmt: skip


CASES = {"fp8": fp8_cases, "splitk": splitk_cases, "ssd": ssd_cases, "hybrid": hybrid_cases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h200", choices=["h200", "b200"])
    ap.add_argument("--only", nargs="*", default=list(CASES), choices=list(CASES))
    ap.add_argument("--spill-check", action="store_true")
    args = ap.parse_args()
    print(f"jax {jax.__version__}, target {args.target}")
    hdr = (f"{'case':<62}{'temp B':>14}{'alias B':>14}{'launch':>7}{'static':>7}  "
           f"{'compile s':>9}  {'pallas kernels: regs / spill-store B / stack B'}")  # fmt: skip
    print(hdr)
    for group in args.only:
        for name, fn, fargs, kw in CASES[group]():
            start = time.perf_counter()
            r = compile_for_gpu(fn, *fargs, target=args.target, no_spills=False, dump_dir=True,
                                **kw)  # fmt: skip
            ks = ", ".join(
                f"{k.name} {k.registers}/{k.spill_store_bytes}/{k.stack_bytes}"
                for k in r.pallas_kernels
            )
            line = (f"{name:<62}{r.temp_bytes:>14,}{r.alias_bytes:>14,}{r.launches!s:>7}"
                    f"{r.launches_static!s:>7}  {r.compile_seconds:>9.1f}  {ks}")  # fmt: skip
            if args.spill_check:
                try:
                    compile_for_gpu(fn, *fargs, target=args.target, no_spills=True, **kw)
                    line += "  [no-spill compile: ok]"
                except RegisterSpillError:
                    line += "  [no-spill compile: FAILS]"
            print(line + f"  (wall {time.perf_counter() - start:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
