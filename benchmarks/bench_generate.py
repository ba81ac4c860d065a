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

Measured on that checkpoint (this machine: 2 AMD EPYC cores with AVX2; 2026-12-07, idle,
side by side, 16 new tokens, default limits): xla prefill 32.3 tokens/s, decode 13.0, 10.8
CPU-s per generate; the engine (`--engine`) decode 11.8; transformers bf16
(tools/qwen3_cpu_bench.py) prefill 8.0, decode 13.0, 15.4 CPU-s. Two XLA:CPU costs made the
xla decode step 0.96 s before (3.08 tokens/s): a bf16 GEMM with a bf16 output runs 1.7-6x
slower than with a float32 output there (the MLP's gate/up/down; `core.arena.linear` now asks
for float32 and rounds once, the same numbers), and the engine's sampler ran a top-20 over the
151,936-token vocabulary every step (~370 ms for 4 rows) though no request asked for logprobs
(now only when one does). `"pallas"` measures the Pallas interpreter (decode 2.1).
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


def engine_decode(args, prompts: list[list[int]]) -> int:
    """The engine's figures on the same prompts: all four added at once, greedy, ignoring EOS;
    prefill tokens/s from a `max_tokens=1` run (the prompts' mixed step and the sampler);
    decode tokens/s = the 4 sequences' tokens after the first over the rest of the run."""
    from jaxarena.engine import Engine, SamplingParams

    engine = Engine.from_pretrained(args.checkpoint, max_batch_size=len(prompts),
                                    max_seq_len=args.max_seq_len, max_batch_tokens=64,
                                    kv_block_size=16, kernels=args.kernels,
                                    token_buckets=(64,), log=None)  # fmt: skip

    def run(n: int) -> float:
        sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        t0 = time.perf_counter()
        engine.generate(prompts, sp)
        return time.perf_counter() - t0

    run(args.new_tokens)  # warm (the executables compiled in from_pretrained)
    first = [run(1) for _ in range(args.repeats)]
    full = [run(args.new_tokens) for _ in range(args.repeats)]
    t1, tn = statistics.median(first), statistics.median(full)
    decode = len(prompts) * (args.new_tokens - 1) / (tn - t1)
    print(f"engine on {args.checkpoint}, kernels {engine.runner.model.env.kernels}, prompts "
          f"{[len(p) for p in prompts]}, {args.new_tokens} new tokens each, median of "
          f"{args.repeats}")  # fmt: skip
    print(f"prefill: {sum(map(len, prompts)) / t1:10.1f} tokens/s (with the first token)")
    print(f"decode:  {decode:10.1f} tokens/s (batch {len(prompts)})")
    print("compile: " + ", ".join(f"{k} {v:.2f} s" for k, v in
                                  engine.runner.compile_seconds.items()))  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", type=Path, default=FIXTURES / LARGEST)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kernels", choices=("pallas", "xla", "auto"), default="pallas",
                    help="kernel backend (load_pretrained's kernels)")
    ap.add_argument("--max-seq-len", type=int, default=64)
    ap.add_argument("--engine", action="store_true",
                    help="the serving engine (jaxarena.engine) instead of CausalLM.generate")
    args = ap.parse_args(argv)

    ref = np.load(FIXTURES / LARGEST / "reference.npz")
    prompts = [ref["prompt_ids"][i, :n].tolist() for i, n in enumerate(ref["prompt_lengths"])]
    if args.engine:
        return engine_decode(args, prompts)
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
