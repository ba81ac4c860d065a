"""Decode launches per layer of ArenaLM against the plain step, by kind (issue 39):

    JAX_PLATFORMS=cpu python benchmarks/decode_launches.py qwen3-8b [--batch 8 64]
        [--max-seq-len 4096] [--list]

A preset name (jaxarena/presets) or a `benchmarks/step_costs.py` model name; random bf16
weights as `ShapeDtypeStruct`s, compiled for an H200 without a GPU. Each step is compiled
at 2 and 3 layers: one layer's launches are the difference (the embedding, final norm and
LM head cancel). Each launch of the 3-layer compile is classified: `gemm` (XLA's Triton or
cuBLAS GEMMs), `pallas` (a `pallas_call`), `copy`, `memset`, `fusion` (every other XLA
kernel: norms, RoPE, scatters, adds); `--list` prints the thunk sequence of both forms.
A report, not a test.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_step import abstract_caches, abstract_params, build_model, plain_decode_step  # noqa: E402
from step_costs import MODELS, PRESETS  # noqa: E402

from jaxarena.gpu_aot import compile_for_gpu  # noqa: E402
from jaxarena.gpu_dump import walk  # noqa: E402

S, I32, U8 = jax.ShapeDtypeStruct, jnp.int32, jnp.uint8


def kind_of(thunk, hlo_name: str) -> str:
    """The class of one launch (see the module docstring)."""
    if thunk.kind in ("kCopy", "kDeviceToDeviceCopy"):
        return "copy"
    if thunk.kind in ("kMemset32BitValue", "kMemzero"):
        return "memset"
    if thunk.kind in ("kGemm", "kCublasLtMatmul") or thunk.name.startswith("gemm_fusion"):
        return "gemm"
    if hlo_name.startswith("pallas_call"):
        return "pallas"
    return "fusion"


def compile_both(raw: dict, layers: int, batch: int, max_seq_len: int):
    """`(arena, plain)` `GpuCompiled`s of the decode step with `layers` layers."""
    m = build_model(dict(raw, num_hidden_layers=layers), max_batch_tokens=256,
                    max_seq_len=max_seq_len, max_batch_size=batch)  # fmt: skip
    per = m.max_seq_len // m.kv_block_size
    params = abstract_params(m)
    caches = abstract_caches(m, num_blocks=batch * per, rows=batch)
    v, tables = S((batch,), I32), S((batch, per), I32)
    arena = compile_for_gpu(m.decode_step, params, S(m.plan.arena_shape, U8), caches, v, v,
                            tables, v, target="h200", donate_argnums=(1, 2), dump_dir=True)  # fmt: skip
    plain = compile_for_gpu(functools.partial(plain_decode_step, m), params, caches, v, v,
                            tables, v, target="h200", donate_argnums=(1,), dump_dir=True)  # fmt: skip
    return arena, plain


def classes(res) -> collections.Counter:
    """Launches of `res` by class (containers' children counted once)."""
    out: collections.Counter = collections.Counter()
    for t in walk(res.thunks):
        if t.sections:
            continue
        out[kind_of(t, res.thunk_names.get(t.thunk_id, ""))] += 1
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a preset name or a step_costs.py model name")
    ap.add_argument("--batch", nargs="+", type=int, default=[8, 64])
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--list", action="store_true", help="print the 3-layer thunk sequences")
    args = ap.parse_args(argv)
    preset = PRESETS / f"{args.model}.json"
    raw = MODELS[args.model] if args.model in MODELS else json.loads(preset.read_text())
    for batch in args.batch:
        (a2, p2), (a3, p3) = (compile_both(raw, n, batch, args.max_seq_len) for n in (2, 3))
        for form, two, three in (("arena", a2, a3), ("plain", p2, p3)):
            per = classes(three) - classes(two)
            detail = ", ".join(f"{k} {n}" for k, n in sorted(per.items()))
            print(f"{args.model} batch {batch} {form}: {three.launches - two.launches} launches "
                  f"per layer ({detail}); 3 layers {three.launches}, temp "
                  f"{three.temp_bytes / 2**20:.2f} MiB, spills {three.max_spill_bytes} B",
                  flush=True)  # fmt: skip
            if args.list:
                for t in walk(three.thunks):
                    name = three.thunk_names.get(t.thunk_id, "")
                    print(f"  {t.thunk_id:4d} {kind_of(t, name):7} {t.name or t.kind} {name}")


if __name__ == "__main__":
    main()
