"""The serving engine on a synthetic workload, against static batches of `CausalLM.generate`,
and the engine's executables compiled for a GPU without one.

CPU workload (default): `--requests` requests with random prompt lengths (uniform in
`--prompt-len`), random output lengths (uniform in `--max-tokens`), arriving as a Poisson
process at `--rate` requests per second, greedy. The engine adds each request when its
arrival time has passed and steps while anything is unfinished. The baseline runs the same
requests through `CausalLM.generate` in arrival order, in static batches of `max_batch_size`
that start when their last request has arrived and the previous batch is done, each batch
decoding as many tokens as its longest request wants. Printed: output tokens per second over
the whole run, and per-request latency (arrival to last token) percentiles, for both.

  python benchmarks/bench_engine.py --checkpoint tests/fixtures/checkpoints/qwen3
  python benchmarks/bench_engine.py --gpu-costs qwen3-8b qwen3-30b-a3b

`--gpu-costs`: compiles the engine's executables (decode, mixed@256, mixed@8192 at the
default limits) for a deviceless H200 (`jaxarena.gpu_aot`, CUDA plugin needed) from the
preset's config with abstract weights, and prints temp bytes, launches per call and compile
seconds of each.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def _workload(args, vocab: int):
    rng = np.random.default_rng(args.seed)
    lo, hi = args.prompt_len
    olo, ohi = args.max_tokens
    arrivals = np.cumsum(rng.exponential(1.0 / args.rate, args.requests))
    return [(float(t), rng.integers(0, vocab, int(rng.integers(lo, hi + 1))).tolist(),
             int(rng.integers(olo, ohi + 1))) for t in arrivals]  # fmt: skip


def _percentiles(lat: list[float]) -> str:
    p = np.percentile(lat, [50, 90, 99])
    return f"p50 {p[0]:.2f} s, p90 {p[1]:.2f} s, p99 {p[2]:.2f} s"


def run_engine(args, work) -> None:
    from jaxarena.engine import Engine, SamplingParams

    engine = Engine.from_pretrained(args.checkpoint, max_batch_size=args.max_batch_size,
                                    max_seq_len=args.max_seq_len,
                                    max_batch_tokens=args.max_batch_tokens,
                                    kv_pages=args.kv_pages, kernels=args.kernels)  # fmt: skip
    pending = list(enumerate(work))
    start = time.perf_counter()
    done, ids, tokens = {}, {}, 0
    while pending or engine.has_unfinished():
        now = time.perf_counter() - start
        while pending and pending[0][1][0] <= now:
            i, (_, prompt, n) = pending.pop(0)
            sp = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
            ids[engine.add_request(prompt, sp)] = i
        if not engine.has_unfinished():
            time.sleep(min(0.01, max(pending[0][1][0] - now, 0)))
            continue
        for ev in engine.step():
            tokens += len(ev.token_ids)
            if ev.finished:
                i = ids[ev.request_id]
                done[i] = time.perf_counter() - start - work[i][0]
    total = time.perf_counter() - start
    print(f"engine: {tokens} tokens in {total:.1f} s = {tokens / total:.2f} tokens/s; latency "
          f"{_percentiles(list(done.values()))}; steps {engine.stats_steps}, "
          f"{engine.preemptions} preemptions")  # fmt: skip


def run_static(args, work) -> None:
    from jaxarena.models import load_pretrained

    lm = load_pretrained(args.checkpoint, max_batch_tokens=args.max_batch_tokens,
                         max_seq_len=args.max_seq_len, max_batch_size=args.max_batch_size,
                         kernels=args.kernels)  # fmt: skip
    lm.generate([work[0][1]], 2)  # compile prefill and decode before the clock starts
    start = time.perf_counter()
    lat, tokens = [], 0
    for k in range(0, len(work), args.max_batch_size):
        batch = work[k : k + args.max_batch_size]
        wait = batch[-1][0] - (time.perf_counter() - start)
        if wait > 0:
            time.sleep(wait)
        lm.generate([p for _, p, _ in batch], max(n for *_, n in batch))
        end = time.perf_counter() - start
        lat += [end - t for t, _, _ in batch]
        tokens += sum(n for *_, n in batch)
    total = time.perf_counter() - start
    print(f"static batches: {tokens} useful tokens in {total:.1f} s = {tokens / total:.2f} "
          f"tokens/s; latency {_percentiles(lat)}")  # fmt: skip


def gpu_costs(names: list[str]) -> None:
    import jax

    from jaxarena.engine.runner import abstract_inputs, penalty_state, step_functions
    from jaxarena.gpu_aot import compile_for_gpu
    from jaxarena.step_report import abstract_model

    for name in names:
        lm, params, caches = abstract_model(name, target="h200")
        arena = jax.ShapeDtypeStruct(lm.plan.arena_shape, np.uint8)
        pen = jax.eval_shape(lambda lm=lm: penalty_state(lm))
        buckets = (256, lm.max_batch_tokens)
        for exe, fn in step_functions(lm, buckets).items():
            res = compile_for_gpu(jax.jit(fn, donate_argnums=(1, 2, 3)), params, arena, caches,
                                  pen, *abstract_inputs(lm, exe), target="h200",
                                  no_spills=False, dump_dir=True)  # fmt: skip
            spills = sum(1 for k in res.kernels if k.spill_store_bytes or k.spill_load_bytes)
            print(f"{name} {exe}: temp {res.temp_bytes / 2**20:.2f} MiB, launches "
                  f"{res.launches} ({res.launches / lm.config.num_hidden_layers:.1f} per layer), "
                  f"spills {spills}, compile {res.compile_seconds:.1f} s", flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", default="tests/fixtures/checkpoints/qwen3")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate", type=float, default=4.0, help="arrivals per second (Poisson)")
    ap.add_argument("--prompt-len", type=int, nargs=2, default=(4, 48))
    ap.add_argument("--max-tokens", type=int, nargs=2, default=(4, 32))
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--max-seq-len", type=int, default=96)
    ap.add_argument("--max-batch-tokens", type=int, default=128)
    ap.add_argument("--kv-pages", type=int, default=None)
    ap.add_argument("--kernels", default="auto", help="pallas, xla or auto (xla on CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("engine", "static"), default=None)
    ap.add_argument("--gpu-costs", nargs="*", default=None, metavar="PRESET")
    args = ap.parse_args()
    if args.gpu_costs is not None:
        gpu_costs(args.gpu_costs or ["qwen3-8b", "qwen3-30b-a3b"])
        return
    import json
    from pathlib import Path

    vocab = json.loads((Path(args.checkpoint) / "config.json").read_text())["vocab_size"]
    work = _workload(args, vocab)
    if args.only != "static":
        run_engine(args, work)
    if args.only != "engine":
        run_static(args, work)


if __name__ == "__main__":
    main()
