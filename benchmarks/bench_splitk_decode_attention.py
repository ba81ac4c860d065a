"""Benchmark: split-K paged decode attention, kernel vs plain XLA vs JAX's own decode kernel.

    python benchmarks/bench_splitk_decode_attention.py [--batch 1 8 64] [--context 1024 8192]

GQA 8:1 (32 query heads, 4 KV heads), head dim 128, bf16, pages of 16 tokens (vLLM layout),
every sequence at the full context length, its pages shuffled through the cache. Reports the
achieved GB/s of KV read (`2 * B * context * Hkv * D * 2` bytes per call: the bytes any decode
attention must read; q and the output are negligible).

Contenders:
  - `xla`: plain XLA, one jitted function: gather the pages in bf16, grouped einsums with f32
    softmax. (The test reference repeats K/V per query head in f32, which is 16x the bytes and
    does not fit the largest shapes, so it is not timed here.)
  - `kernel`: `splitk_decode_attention` with the split count the policy gives the detected
    target (GPU only: the Pallas interpreter is not a speed).
  - `jax_gqa`: `jax.experimental.pallas.ops.gpu.decode_attention.gqa` (GPU only, when it
    imports), on the same keys stored contiguously `[B, context, Hkv, D]`, so it reads no block
    table: an upper bound for a paged kernel.
On a CPU only `xla` runs, and only on shapes of at most `--cpu-max-tokens` tokens
(`B * context`), so the run stays near a minute.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from _timing import median_seconds  # benchmarks/_timing.py (script dir on sys.path)

from jaxarena import Target
from pallas_kernels.splitk_decode_attention import splitk_decode_attention, splitk_num_splits

HQ, HKV, HEAD_DIM, BLOCK_SIZE = 32, 4, 128, 16


def kv_read_bytes(batch: int, context: int, dtype=jnp.bfloat16) -> int:
    """Bytes of K and V one decode step reads: `2 * B * context * Hkv * D * itemsize`."""
    return 2 * batch * context * HKV * HEAD_DIM * jnp.dtype(dtype).itemsize


@jax.jit
def xla_paged_decode(q, k_cache, v_cache, block_tables, seq_lens):
    """Plain-XLA paged GQA decode: page gather in the cache dtype, f32 softmax."""
    B, Hq, D = q.shape
    hkv = k_cache.shape[2]
    k = k_cache[block_tables].reshape(B, -1, hkv, D)  # [B, T, Hkv, D]
    v = v_cache[block_tables].reshape(B, -1, hkv, D)
    qg = q.reshape(B, hkv, Hq // hkv, D)
    logits = jnp.einsum("bkgd,btkd->bkgt", qg, k, preferred_element_type=jnp.float32)
    logits = logits / np.sqrt(D).astype(np.float32)
    valid = jnp.arange(k.shape[1])[None, :] < seq_lens[:, None]
    logits = jnp.where(valid[:, None, None, :], logits, -jnp.inf)
    p = jax.nn.softmax(logits, axis=-1)
    out = jnp.einsum("bkgt,btkd->bkgd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return out.reshape(B, Hq, D).astype(q.dtype)


def _jax_gqa() -> Callable | None:
    try:
        from jax.experimental.pallas.ops.gpu import decode_attention
    except Exception:  # noqa: BLE001 - any import failure means "not available"
        return None
    return getattr(decode_attention, "gqa", None)


def make_inputs(batch: int, context: int, rng: np.random.Generator):
    """q, the paged caches (pages shuffled), block tables and lengths, all on device."""
    pages = context // BLOCK_SIZE
    num_blocks = batch * pages
    key = jax.random.key(int(rng.integers(2**31)))
    kq, kk, kv = jax.random.split(key, 3)
    bf16 = jnp.bfloat16
    q = jax.random.normal(kq, (batch, HQ, HEAD_DIM), bf16)
    k_cache = jax.random.normal(kk, (num_blocks, BLOCK_SIZE, HKV, HEAD_DIM), bf16)
    v_cache = jax.random.normal(kv, (num_blocks, BLOCK_SIZE, HKV, HEAD_DIM), bf16)
    tables = jnp.asarray(rng.permutation(num_blocks).reshape(batch, pages), jnp.int32)
    lens = jnp.full((batch,), context, jnp.int32)
    return q, k_cache, v_cache, tables, lens


def main(argv: list[str] | None = None) -> None:
    """Runs the benchmark and prints one row per (B, context)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--context", type=int, nargs="+", default=[1024, 8192, 32768])
    parser.add_argument("--min-seconds", type=float, default=0.3, help="timing per case")
    parser.add_argument("--cpu-max-tokens", type=int, default=65536, help="B * context on CPU")
    args = parser.parse_args(argv)

    backend = jax.default_backend()
    on_gpu = backend == "gpu"
    target = Target.detect()
    print(
        f"backend={backend} device={jax.devices()[0].device_kind} target={target.name} "
        f"Hq={HQ} Hkv={HKV} D={HEAD_DIM} page={BLOCK_SIZE} bf16"
    )
    gqa = _jax_gqa() if on_gpu else None
    if not on_gpu:
        print(
            "CPU: timing plain XLA only (the Pallas interpreter is not a speed), shapes with "
            f"B * context <= {args.cpu_max_tokens}"
        )
    header = f"{'B':>4} {'context':>8} {'MB KV':>8} {'xla us':>10} {'xla GB/s':>9}"
    if on_gpu:
        header += f" {'splits':>6} {'kernel us':>10} {'kernel GB/s':>11}"
        header += f" {'jax_gqa us':>10} {'jax GB/s':>9}" if gqa else ""
    print(header)
    kernel = jax.jit(
        functools.partial(splitk_decode_attention, target=target), static_argnames="num_splits"
    )
    rng = np.random.default_rng(0)
    for batch in args.batch:
        for context in args.context:
            if not on_gpu and batch * context > args.cpu_max_tokens:
                continue
            row = _run_case(
                batch, context, rng, kernel=kernel if on_gpu else None, gqa=gqa, target=target,
                min_seconds=args.min_seconds, max_iters=500 if on_gpu else 20,
            )  # fmt: skip
            print(row, flush=True)


def _run_case(batch, context, rng, *, kernel, gqa, target, min_seconds, max_iters) -> str:
    """Times one (B, context) for every contender that runs here; returns the table row."""
    q, k_cache, v_cache, tables, lens = make_inputs(batch, context, rng)
    nbytes = kv_read_bytes(batch, context)

    def timed(fn):
        return median_seconds(fn, min_seconds=min_seconds, max_iters=max_iters)

    t_x = timed(lambda: xla_paged_decode(q, k_cache, v_cache, tables, lens))
    row = f"{batch:>4} {context:>8} {nbytes / 1e6:>8.1f} {t_x * 1e6:>10.1f}"
    row += f" {nbytes / t_x / 1e9:>9.2f}"
    if kernel is None:
        return row
    n = splitk_num_splits(batch, HQ, target=target)
    t_k = timed(lambda: kernel(q, k_cache, v_cache, tables, lens, num_splits=n))
    row += f" {n:>6} {t_k * 1e6:>10.1f} {nbytes / t_k / 1e9:>11.1f}"
    if gqa is not None:
        # The same keys, contiguous: [B, context, Hkv, D] in token order.
        k_flat = k_cache[tables].reshape(batch, context, HKV, HEAD_DIM)
        v_flat = v_cache[tables].reshape(batch, context, HKV, HEAD_DIM)
        t_g = timed(lambda: gqa(q, k_flat, v_flat, kv_seq_len=lens))
        row += f" {t_g * 1e6:>10.1f} {nbytes / t_g / 1e9:>9.1f}"
    return row


if __name__ == "__main__":
    main()
