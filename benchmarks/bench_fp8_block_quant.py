"""Benchmark: FP8 block-scaled activation quantization, kernel vs the plain-XLA reference.

    python benchmarks/bench_fp8_block_quant.py [--k 7168] [--m 1 16 256 4096] [--dtype bfloat16]

Reports achieved GB/s: bytes read (x) plus bytes written (q, 1 byte per element, and the f32
scales) per second. On a CPU only the XLA reference runs (the Pallas interpreter is not a
meaningful speed); on a GPU the compiled Triton kernel runs too, and both are put against the
device's copy bandwidth, measured with a jitted elementwise pass over a large buffer.
"""

from __future__ import annotations

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from _timing import median_seconds  # benchmarks/_timing.py (script dir on sys.path)

from pallas_kernels.fp8_block_quant import fp8_block_quant, fp8_block_quant_reference


def traffic_bytes(m: int, k: int, dtype, block_size: int = 128) -> int:
    """Bytes one quantization moves: x read, q and the scales written."""
    return m * k * jnp.dtype(dtype).itemsize + m * k + m * -(-k // block_size) * 4


def copy_bandwidth(*, nbytes: int = 1 << 30, min_seconds: float = 0.5) -> float:
    """Device copy bandwidth in bytes/s: a jitted `a + 1` over `nbytes` of f32 (read + write)."""
    a = jnp.zeros((nbytes // 4,), jnp.float32)
    step = jax.jit(lambda a: a + jnp.float32(1))
    seconds = median_seconds(lambda: step(a), min_seconds=min_seconds, max_iters=50)
    return 2 * a.size * 4 / seconds


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark and prints one row per M."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 256, 4096])
    parser.add_argument("--k", type=int, default=7168)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--scale-format", default="f32", choices=["f32", "ue8m0"])
    parser.add_argument("--min-seconds", type=float, default=0.3, help="timing per case")
    args = parser.parse_args(argv)

    backend = jax.default_backend()
    on_gpu = backend == "gpu"
    dtype = jnp.dtype(args.dtype)
    print(f"backend={backend} device={jax.devices()[0].device_kind} K={args.k} x={dtype.name} "
          f"scale_format={args.scale_format}")  # fmt: skip
    peak = None
    if on_gpu:
        peak = copy_bandwidth()
        print(f"copy bandwidth (jitted a + 1 over 1 GiB): {peak / 1e9:.0f} GB/s")
    else:
        print("CPU: timing the XLA reference only (the Pallas interpreter is not a speed)")

    reference = jax.jit(
        functools.partial(fp8_block_quant_reference, scale_format=args.scale_format)
    )
    kernel = jax.jit(functools.partial(fp8_block_quant, scale_format=args.scale_format))
    header = f"{'M':>6} {'MB moved':>9} {'xla us':>9} {'xla GB/s':>9}"
    if on_gpu:
        header += f" {'kernel us':>9} {'kernel GB/s':>11} {'kernel/copy':>11} {'xla/copy':>9}"
    print(header)
    rng = np.random.default_rng(0)
    for m in args.m:
        x = jnp.asarray(rng.standard_normal((m, args.k), np.float32), dtype)
        moved = traffic_bytes(m, args.k, dtype)
        t_ref = median_seconds(
            lambda x=x: reference(x), min_seconds=args.min_seconds, max_iters=200
        )
        row = f"{m:>6} {moved / 1e6:>9.2f} {t_ref * 1e6:>9.1f} {moved / t_ref / 1e9:>9.2f}"
        if on_gpu:
            t_k = median_seconds(
                lambda x=x: kernel(x), min_seconds=args.min_seconds, max_iters=1000
            )
            row += (
                f" {t_k * 1e6:>9.1f} {moved / t_k / 1e9:>11.1f}"
                f" {moved / t_k / peak:>11.1%} {moved / t_ref / peak:>9.1%}"
            )
        print(row, flush=True)


if __name__ == "__main__":
    main()
