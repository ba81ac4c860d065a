"""Benchmark: Mamba-2 SSD chunked scan, Pallas kernel vs the plain-XLA chunked reference.

    python benchmarks/bench_ssd_chunked_scan.py [--t 256 4096 16384] [--dtype float32]

One sequence of T tokens, H = 64 heads of P = 64, state N = 128, G = 8 groups, chunk 64 (the
arena scratch's chunk length), `dt_softplus`, `dt_bias` and `D` on: the prefill shape of a
Mamba-2 layer. Prints the median wall time and tokens/s. On a CPU only the XLA reference runs
(the Pallas interpreter is not a meaningful speed) and T is capped by `--cpu-max-t`, so the
run stays near a minute on two cores; on a GPU the compiled Triton kernels run as well, with
the arena-sized f32 scratch donated to the step.

Anchor. mamba_ssm's Triton path (`mamba_chunk_scan_combined`: five kernels, chunk cumsum,
bmm, chunk state, state passing, chunk scan) is the reference implementation; we found no
absolute figure for it published by its authors. Published points near it:
- tile-ai/tilelang `benchmark/mamba2/README.md`: the chunk-scan step alone (one of the five
  kernels), batch 8, 80 heads, P = 64, N = 128, G = 1, chunk 256, on an H800 SXM: 2.53 ms at
  seq_len 16384 (about 52 M tokens/s for 80 heads, ~135 TFLOP/s), with mamba_ssm's Triton
  kernel plotted as a slower baseline in the same document.
- PyTorch blog "Accelerating Mamba2 with Kernel Fusion": one fused Triton SSD kernel is
  1.5x-2.5x faster than mamba_ssm's five kernels on A100 / H100.
So on an H100/H200 a competitive whole scan is in the tens of millions of tokens/s at these
shapes. This kernel computes its matmuls in f32 (IEEE precision, no tensor-core TF32) and
runs the state passing as an XLA `lax.scan` over chunks, so expect it below that anchor.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxarena.workspaces import ssd_scratch_layout
from pallas_kernels.ssd_chunked_scan import ssd_chunked_reference, ssd_chunked_scan

H, P, N, G = 64, 64, 128, 8


def _inputs(T: int, dtype) -> dict:
    rng = np.random.default_rng(0)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape, np.float32))

    return dict(
        x=normal(T, H, P).astype(dtype),
        dt=jnp.asarray(rng.uniform(-2.0, 0.5, (T, H)).astype(np.float32)),
        A=-jnp.exp(normal(H)),
        B=normal(T, G, N).astype(dtype),
        C=normal(T, G, N).astype(dtype),
        D=normal(H),
        dt_bias=normal(H) * 0.1,
    )


def _time(fn, *args, reps: int) -> float:
    jax.block_until_ready(fn(*args))  # compile and warm up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--t", type=int, nargs="+", default=[256, 4096, 16384])
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cpu-max-t", type=int, default=16384)
    ap.add_argument(
        "--kernel-on-cpu",
        action="store_true",
        help="time the kernel in interpret mode on CPU too (slow: only to check the script)",
    )
    args = ap.parse_args()
    dtype = jnp.dtype(args.dtype)
    on_gpu = jax.default_backend() == "gpu"
    print(f"backend={jax.default_backend()} device={jax.devices()[0].device_kind}")
    print(f"H={H} P={P} N={N} G={G} chunk=64 dtype={dtype.name} (median of {args.reps})")
    print(f"{'T':>6} {'impl':>16} {'ms':>10} {'tokens/s':>12}")

    @jax.jit
    def xla_ref(x, dt, A, B, C, D, dt_bias):
        return ssd_chunked_reference(
            x, dt, A, B, C, chunk_size=64, D=D, dt_bias=dt_bias, dt_softplus=True
        )

    for T in args.t:
        if not on_gpu and T > args.cpu_max_t:
            print(f"{T:>6} {'(skipped on CPU)':>16}")
            continue
        inp = _inputs(T, dtype)
        order = ("x", "dt", "A", "B", "C", "D", "dt_bias")
        sec = _time(xla_ref, *(inp[k] for k in order), reps=args.reps)
        print(f"{T:>6} {'xla reference':>16} {sec * 1e3:>10.2f} {T / sec:>12.4g}")
        if on_gpu or args.kernel_on_cpu:
            n = sum(b for _, b in ssd_scratch_layout(H, G, T).values()) // 4
            ws = jnp.zeros((n,), jnp.float32)

            @functools.partial(jax.jit, donate_argnums=0)
            def step(ws, x, dt, A, B, C, D, dt_bias):
                y, final, ws = ssd_chunked_scan(
                    x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=True, workspace=ws
                )
                return ws, y, final

            def run(*a, _step=step):
                nonlocal ws
                ws, y, final = _step(ws, *a)
                return y, final

            sec = _time(run, *(inp[k] for k in order), reps=args.reps)
            print(f"{T:>6} {'pallas kernel':>16} {sec * 1e3:>10.2f} {T / sec:>12.4g}")


if __name__ == "__main__":
    main()
