"""Prefill and decode throughput of a HuggingFace checkpoint on the arena, and the arena's
share of the device memory the model uses.

    python benchmarks/bench_generate.py                       # the largest fixture (qwen3_fp8)
    python benchmarks/bench_generate.py --checkpoint DIR --new-tokens 32 --repeats 5
    python benchmarks/bench_generate.py --checkpoint DIR --kernels xla   # plain-XLA kernels

Loads the checkpoint with `load_pretrained` (serve limits: 64 batch tokens, 4 sequences,
max_seq_len 64), runs `generate` on the fixture's four reference prompts (1, 5, 11 and 16
tokens, packed into one prefill) `--repeats` times after one warm-up call that compiles, and
prints the medians: prefill tokens/s (prompt tokens over the prefill's run time) and decode
tokens/s (new tokens of the 4 sequences over the decode loop's run time), the compile
seconds, the CPU-seconds of one `generate` call (prefill and decode, all threads: on a
shared machine a steadier figure than wall time), and the bytes of the weights, the arena
and the KV / SSM caches. `--kernels` chooses the kernel backend (`load_pretrained(kernels=)`):
with `pallas` (the default) the Pallas kernels run in interpret mode on CPU, so the figures
measure the interpreter, not a GPU; `xla` runs their plain-XLA implementations (the CPU's
fast path); `auto` picks `xla` on CPU. `tools/qwen3_cpu_bench.py` makes issue #37's 28-layer
Qwen3-0.6B-width checkpoint and times transformers on it the same way.

Measured on that checkpoint (this machine: 2 AMD EPYC cores with AVX2, shared with other
developers' jobs, so wall-clock figures are noisy and only side-by-side ones compare;
2026-12-07, 8 new tokens, 28 layers under `scan_layers=True`, which compiles in seconds):
at load average ~2, xla prefill 16.3 tokens/s, decode 3.08 tokens/s, 20.2 CPU-s per
generate; pallas 12.6-12.8 / 2.11-2.12, 28.7-29.0 CPU-s; transformers bf16
(tools/qwen3_cpu_bench.py) 7.2 / 11.0, 12.1 CPU-s. The XLA kernels make the step 1.45x
faster than the interpreter here, but decode reaches 28% of transformers', not the 50% of
issue #37's target: at these lengths attention is a small part of the step and the rest
(dense bf16 GEMMs, XLA:CPU's bf16 dot 3.9 ms vs torch's 3.2 ms for `[4, 1024] @ [1024,
6144]`, and ~0.9 s per step not yet attributed) dominates. Unrolled (this script's
defaults) under load 16 the compile took 221 s + 215 s.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

from jaxarena.models import load_pretrained

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "checkpoints"
LARGEST = "qwen3_fp8"  # by file bytes (see tests/fixtures/checkpoints/README.md)


def format_bytes(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.2f} KiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=FIXTURES / LARGEST)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kernels", choices=("pallas", "xla", "auto"), default="pallas",
                    help="kernel backend (load_pretrained's kernels)")
    ap.add_argument("--max-seq-len", type=int, default=64)
    args = ap.parse_args(argv)

    ref = np.load(FIXTURES / LARGEST / "reference.npz")
    prompts = [ref["prompt_ids"][i, :n].tolist() for i, n in enumerate(ref["prompt_lengths"])]
    lm = load_pretrained(args.checkpoint, max_batch_tokens=64, max_seq_len=args.max_seq_len,
                         kv_block_size=16, max_batch_size=len(prompts),
                         kernels=args.kernels)  # fmt: skip
    lm.generate(prompts, args.new_tokens)  # compiles prefill and the decode step
    stats, cpu = [], []
    for _ in range(args.repeats):
        t0 = time.process_time()
        lm.generate(prompts, args.new_tokens)
        cpu.append(time.process_time() - t0)
        stats.append(lm.last_stats)
    prefill = statistics.median(s["prefill_tokens"] / s["prefill_seconds"] for s in stats)
    decode = statistics.median(s["decode_tokens"] / s["decode_seconds"] for s in stats)
    used = lm.weight_bytes + lm.arena_bytes + lm.cache_bytes
    dev = jax.devices()[0]
    limit = (dev.memory_stats() or {}).get("bytes_limit")

    print(f"{lm.model_type} ({'fp8' if lm.fp8 else 'bf16'}) from {lm.path} on {dev.platform}, "
          f"kernels {lm.model.env.kernels}")  # fmt: skip
    print(f"prompts {[len(p) for p in prompts]}, {args.new_tokens} new tokens each, "
          f"median of {args.repeats}")  # fmt: skip
    print(f"prefill: {prefill:10.1f} tokens/s")
    print(f"decode:  {decode:10.1f} tokens/s (batch {len(prompts)})")
    print(f"cpu:     {statistics.median(cpu):10.2f} CPU-seconds per generate call (all threads)")
    print("compile: " + ", ".join(f"{k} {v:.2f} s" for k, v in lm.compile_seconds.items()))
    print(f"weights {format_bytes(lm.weight_bytes)}, arena {format_bytes(lm.arena_bytes)}, "
          f"caches {format_bytes(lm.cache_bytes)}: the arena is "
          f"{100 * lm.arena_bytes / used:.1f}% of the {format_bytes(used)} the model holds on "
          "the device")  # fmt: skip
    if limit:
        print(f"device memory {format_bytes(limit)}: the arena is "
              f"{100 * lm.arena_bytes / limit:.4f}% of it")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
