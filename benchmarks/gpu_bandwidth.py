"""Achieved GB/s of every kernel against the device's copy bandwidth, and its real footprint.

    python benchmarks/gpu_bandwidth.py [--small] [--min-seconds 0.3]

On a GPU: measures the copy bandwidth once (a jitted `a + 1` over 1 GiB of f32: a plain XLA
read + write), then for each kernel at the CI compile gate's shapes (tests/gpu) times it and
prints the bytes it must move (a lower bound: every input read once, every output written
once), the achieved GB/s and the fraction of the copy bandwidth. Each case also compiles once
with an XLA dump and prints the REAL compile's temp/alias bytes and launches per call, the
figures `benchmarks/gpu_compile_figures.py` and the CI gate predict without a GPU, so one run
puts predictions and reality side by side (`benchmarks/gpu_all.sh` runs both).

On a CPU nothing is timed (the Pallas interpreter is not a speed); `--small` shrinks the shapes
so the script's plumbing can be checked there (footprints of interpret-mode compiles).
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from _timing import median_seconds  # benchmarks/_timing.py (script dir on sys.path)

from jaxarena import ArenaPlan, Levers, Target, gpu_aot

BF16, F32, I32 = jnp.bfloat16, jnp.float32, jnp.int32


def copy_bandwidth(nbytes: int, min_seconds: float) -> float:
    """Bytes/s of a jitted `a + 1` over `nbytes` of f32 (each byte read once, written once)."""
    a = jnp.zeros((nbytes // 4,), F32)
    step = jax.jit(lambda a: a + jnp.float32(1))
    seconds = median_seconds(lambda: step(a), min_seconds=min_seconds, max_iters=50)
    return 2 * a.size * 4 / seconds


def real_footprint(jitted, *args) -> str:
    """temp / alias bytes and launches per call of the real compile on this device."""
    where = tempfile.mkdtemp(prefix="jaxarena_bw_")
    try:
        # jax >= 0.11 dumps PTX only for emitters matching xla_dump_emitter_re (gpu_aot).
        options = {"xla_dump_to": where, "xla_dump_emitter_re": "ptx"}
        compiled = jitted.lower(*args).compile(compiler_options=options)
        mem = compiled.memory_analysis()
        mem = mem[0] if isinstance(mem, list | tuple) else mem
        result = gpu_aot.GpuCompiled(
            compiled=compiled, target=jax.devices()[0].device_kind,
            temp_bytes=int(mem.temp_size_in_bytes), argument_bytes=int(mem.argument_size_in_bytes),
            output_bytes=int(mem.output_size_in_bytes), alias_bytes=int(mem.alias_size_in_bytes),
            hlo_text=compiled.as_text(), compile_seconds=0.0, dump_dir=None,
        )  # fmt: skip
        try:
            gpu_aot.analyze_dump(result, where)  # launches (and registers where ptxas exists)
        except Exception as e:  # noqa: BLE001 - the dump analysis is a bonus, not the point
            print(f"    (dump analysis failed: {type(e).__name__}: {e})")
        return (f"temp {result.temp_bytes:,} B, alias {result.alias_bytes:,} B, "
                f"launches {result.launches}")  # fmt: skip
    finally:
        shutil.rmtree(where, ignore_errors=True)


def fp8_cases(m: int, k: int, rng):
    from pallas_kernels.fp8_block_quant import (
        FFN_ACT_REGIONS,
        FP8_ACT_REGIONS,
        fp8_block_quant,
        fp8_block_quant_into,
        fp8_silu_mul_quant_into,
    )

    x = jnp.asarray(rng.standard_normal((m, k), np.float32), BF16)
    rows, nb = -(-m // 16) * 16, -(-k // 128)
    sizes = (rows * k, rows * nb * 4, nb * rows * 4)
    moved = m * k * 2 + m * k + m * nb * 4
    yield f"fp8_block_quant M={m} K={k}", jax.jit(fp8_block_quant), (x,), moved
    plan = ArenaPlan.sequential(dict(zip(FP8_ACT_REGIONS, sizes, strict=True)))
    fn = jax.jit(functools.partial(fp8_block_quant_into, plan=plan), donate_argnums=0)
    yield (f"fp8_block_quant_into M={m} K={k}", lambda a, x: fn(a, x=x), (plan, x),
           moved + m * nb * 4)  # fmt: skip
    fn = jax.jit(functools.partial(fp8_block_quant_into, plan=plan, scale_format="ue8m0",
                                   scale_layout="packed_ue8m0"), donate_argnums=0)  # fmt: skip
    yield (f"fp8_block_quant_into packed_ue8m0 M={m} K={k}", lambda a, x: fn(a, x=x), (plan, x),
           moved + m * -(-nb // 4) * 4)  # fmt: skip
    plan = ArenaPlan.sequential(dict(zip(FFN_ACT_REGIONS, sizes, strict=True)))
    fn = jax.jit(functools.partial(fp8_silu_mul_quant_into, plan=plan), donate_argnums=0)
    yield (f"fp8_silu_mul_quant_into M={m} I={k}", lambda a, x: fn(a, gate=x, up=x), (plan, x),
           moved + m * k * 2 + m * nb * 4)  # fmt: skip


def splitk_cases(b: int, ctx: int, hq: int, hkv: int, d: int, rng):
    from pallas_kernels.splitk_decode_attention import (
        splitk_decode_attention,
        splitk_decode_attention_into,
    )

    page = 16
    pages = ctx // page
    q = jnp.asarray(rng.standard_normal((b, hq, d), np.float32), BF16)
    kv = jnp.asarray(rng.standard_normal((b * pages, page, hkv, d), np.float32), BF16)
    tables = jnp.arange(b * pages, dtype=I32).reshape(b, pages)
    lens = jnp.full((b,), ctx, I32)
    kw = dict(levers=Levers(), target=Target.preset("hopper"))
    moved = 2 * b * ctx * hkv * d * 2 + 2 * b * hq * d * 2 + b * pages * 4
    name = f"B={b} ctx={ctx} GQA {hq}:{hkv} D={d}"
    fn = jax.jit(functools.partial(splitk_decode_attention, **kw))
    yield f"splitk_decode_attention {name}", fn, (q, kv, kv, tables, lens), moved
    plan = ArenaPlan.sequential(
        {"attn_output": b * hq * d * 2, "splitk_workspace": b * hq * 16 * (d + 2) * 4}
    )
    into = jax.jit(lambda a, *r: splitk_decode_attention_into(a, plan, *r, **kw),
                   donate_argnums=0)  # fmt: skip
    yield (f"splitk_decode_attention_into {name}", into, (plan, q, kv, kv, tables, lens),
           moved)  # fmt: skip


def ssd_cases(t: int, h: int, p: int, n: int, g: int, rng):
    from pallas_kernels.ssd_chunked_scan import ssd_chunked_scan

    def normal(*shape, dtype=BF16):
        return jnp.asarray(rng.standard_normal(shape, np.float32) * 0.5, dtype)

    args = (normal(t, h, p), jnp.abs(normal(t, h, dtype=F32)) * 0.1, -jnp.abs(normal(h, dtype=F32)),
            normal(t, g, n), normal(t, g, n))  # fmt: skip
    moved = 2 * t * h * p * 2 + t * h * 4 + 2 * t * g * n * 2 + h * p * n * 4
    yield f"ssd_chunked_scan T={t} H={h} P={p} N={n} G={g}", jax.jit(ssd_chunked_scan), args, moved


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny shapes (CPU plumbing check)")
    parser.add_argument("--min-seconds", type=float, default=0.3, help="timing per case")
    args = parser.parse_args(argv)
    on_gpu = jax.default_backend() == "gpu"
    print(f"jax {jax.__version__} backend={jax.default_backend()} "
          f"device={jax.devices()[0].device_kind}")  # fmt: skip
    peak = None
    if on_gpu:
        peak = copy_bandwidth(1 << 30, args.min_seconds)
        print(f"copy bandwidth (jitted a + 1 over 1 GiB f32, read + write): {peak / 1e9:.0f} GB/s")
    else:
        print("CPU: footprints only (the Pallas interpreter is not a speed)")
    rng = np.random.default_rng(0)
    if args.small:
        groups = [fp8_cases(16, 256, rng), splitk_cases(2, 64, 4, 2, 64, rng),
                  ssd_cases(128, 2, 16, 16, 1, rng)]  # fmt: skip
    else:
        groups = [fp8_cases(4096, 7168, rng), splitk_cases(8, 32768, 64, 8, 128, rng),
                  ssd_cases(8192, 64, 64, 128, 8, rng)]  # fmt: skip
    print(f"{'case':<58}{'MB moved':>10}{'us':>10}{'GB/s':>8}{'of copy':>9}  real compile")
    for group in groups:
        try:
            for name, fn, fargs, moved in group:
                try:
                    if isinstance(fargs[0], ArenaPlan):  # an arena form: fresh donated arena
                        plan, rest = fargs[0], fargs[1:]
                        arena = [plan.allocate()]

                        def call(fn=fn, rest=rest, arena=arena):
                            arena[0] = fn(arena[0], *rest)
                            return arena[0]

                        footprint = real_footprint(jax.jit(lambda a, *r, fn=fn: fn(a, *r),
                                                           donate_argnums=0),
                                                   plan.allocate(), *rest)  # fmt: skip
                    else:

                        def call(fn=fn, fargs=fargs):
                            return fn(*fargs)

                        footprint = real_footprint(fn, *fargs)
                    row = f"{name:<58}{moved / 1e6:>10.1f}"
                    if on_gpu:
                        s = median_seconds(call, min_seconds=args.min_seconds, max_iters=500)
                        row += f"{s * 1e6:>10.1f}{moved / s / 1e9:>8.0f}{moved / s / peak:>9.1%}"
                    else:
                        row += f"{'-':>10}{'-':>8}{'-':>9}"
                    print(f"{row}  {footprint}", flush=True)
                except Exception as e:  # noqa: BLE001 - one broken case must not hide the rest
                    print(f"{name:<58} FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    if os.environ.get("JAXARENA_BENCH_TRACEBACK"):
                        traceback.print_exc()
        except Exception as e:  # noqa: BLE001 - building a group's inputs failed
            print(f"case group FAILED: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
