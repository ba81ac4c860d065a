"""Compile seconds of ArenaLM's steps against the number of layers (issue 23 item 5):

    JAX_PLATFORMS=cpu python benchmarks/compile_layers.py [--layers 2 8 28]
        [--targets h200 cpu] [--scan 0 1] [--tokens 2048] [--batch 8] [--model qwen3]

Qwen3-0.6B widths (benchmarks/plain_step.py), random bf16 parameters as `ShapeDtypeStruct`s
(nothing allocated). For each layer count, target and layer form (`scan_layers` off / on):
prefill at `--tokens` tokens and decode at `--batch` sequences, the seconds of trace + lower +
compile. The GPU targets compile deviceless (`jaxarena.gpu_aot.compile_for_gpu`, with launch
and temp figures); `cpu` compiles for this machine's CPU with the Pallas kernels in interpret
mode (temp from XLA's memory analysis). A report, not a test: timings vary with the load.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_step import abstract_caches, abstract_params, build_model  # noqa: E402
from step_costs import MODELS  # noqa: E402

from jaxarena.gpu_aot import compile_for_gpu  # noqa: E402

S, I32, U8 = jax.ShapeDtypeStruct, jnp.int32, jnp.uint8


def _step_args(m, step, *, tokens, batch):
    """The step function and its abstract arguments (decode at `batch`, prefill at `tokens`)."""
    if step == "decode":
        per = m.max_seq_len // m.kv_block_size
        caches = abstract_caches(m, num_blocks=batch * per, rows=batch)
        v, tables = S((batch,), I32), S((batch, per), I32)
        return m.decode_step, (v, v, tables, v), caches
    per = tokens // m.kv_block_size
    caches = abstract_caches(m, num_blocks=(batch + 1) * per, rows=batch + 1)
    tok, cu, tables = S((tokens,), I32), S((batch + 2,), I32), S((batch + 1, per), I32)
    return m.prefill, (tok, cu, tables), caches


def measure(raw, *, layers, target, scan, step, tokens, batch):
    """`{"seconds", "temp", "launches"}` of one step's compile (launches: GPU targets only)."""
    raw = dict(raw, num_hidden_layers=layers)
    m = build_model(raw, max_batch_tokens=tokens, max_seq_len=tokens, max_batch_size=batch,
                    interpret=target == "cpu")  # fmt: skip
    if scan:
        m = dataclasses.replace(m, scan_layers=True)
    params = abstract_params(m)
    if scan:
        params = m.stack_params(params)
    fn, rest, caches = _step_args(m, step, tokens=tokens, batch=batch)  # scanned if m scans
    arena = S(m.plan.arena_shape, U8)
    if target == "cpu":
        start = time.perf_counter()
        c = jax.jit(fn, donate_argnums=(1, 2)).lower(params, arena, caches, *rest).compile()
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "temp": c.memory_analysis().temp_size_in_bytes,
                "launches": None}  # fmt: skip
    c = compile_for_gpu(fn, params, arena, caches, *rest, target=target, donate_argnums=(1, 2),
                        dump_dir=True, no_spills=False)  # fmt: skip
    return {"seconds": c.compile_seconds, "temp": c.temp_bytes, "launches": c.launches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3", choices=list(MODELS))
    ap.add_argument("--layers", nargs="+", type=int, default=[2, 8, 28])
    ap.add_argument("--targets", nargs="+", default=["h200", "cpu"])
    ap.add_argument("--scan", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--steps", nargs="+", default=["prefill", "decode"])
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    print("target  step     form      layers  compile s  launches  temp MiB", flush=True)
    for target in args.targets:
        for step in args.steps:
            for scan in args.scan:
                for n in args.layers:
                    r = measure(MODELS[args.model], layers=n, target=target, scan=scan,
                                step=step, tokens=args.tokens, batch=args.batch)  # fmt: skip
                    form = "scan" if scan else "unrolled"
                    launches = "-" if r["launches"] is None else r["launches"]
                    print(f"{target:6}  {step:7}  {form:8}  {n:6d}  {r['seconds']:9.1f}  "
                          f"{launches!s:>8}  {r['temp'] / 2**20:8.2f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
