"""Compiled cost of ArenaLM's steps at real widths, on a GPU target without a GPU:

    JAX_PLATFORMS=cpu python benchmarks/step_costs.py [--target h200] [--layers N]
        [--models qwen3 llama ...] [--tokens 2048 8192] [--batch 8]
        [--prefill-chunk auto|none|N]

For each model (random weights: shapes only, `ShapeDtypeStruct`s, nothing allocated): the
prefill step's XLA temp at each token count against the arena, and the decode step's
launches (arena form vs the plain step of benchmarks/plain_step.py, total and per layer),
temp, spills and compile seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plain_step import (  # noqa: E402
    QWEN3_0_6B,
    QWEN3_30B_A3B,
    abstract_caches,
    abstract_params,
    build_model,
    plain_decode_step,
    plain_prefill,
)

from jaxarena.gpu_aot import compile_for_gpu  # noqa: E402

S, I32, U8 = jax.ShapeDtypeStruct, jnp.int32, jnp.uint8
LLAMA_1B = dict(QWEN3_0_6B, model_type="llama", architectures=["LlamaForCausalLM"],
                hidden_size=2048, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                intermediate_size=8192, num_hidden_layers=16, vocab_size=128256,
                rope_theta=500000.0, rms_norm_eps=1e-5)  # fmt: skip
PRESETS = Path(__file__).resolve().parent.parent / "jaxarena" / "presets"
MODELS = {
    "qwen3": QWEN3_0_6B,
    "llama": LLAMA_1B,
    "mamba2": json.loads((PRESETS / "mamba2-2.7b.json").read_text()),
    "nemotron_h": json.loads((PRESETS / "nemotron-h-8b.json").read_text()),
    "qwen3_moe": QWEN3_30B_A3B,
    # Qwen3-Next-80B's widths with dense MLPs (the MoE block is measured as qwen3_moe).
    "qwen3_next": dict(
        json.loads((PRESETS / "qwen3-next-80b-a3b.json").read_text()), num_experts=0
    ),
    # DeepSeek-V3's widths (MLA, 256 experts of 2048, top-8) with bf16 weights (the FP8
    # `quantization_config` dropped: the plain step multiplies bf16) and 4 layers:
    # first_k_dense_replace = 3 dense MLP layers, then one routed MoE layer.
    "deepseek_v3": {
        k: v
        for k, v in json.loads((PRESETS / "deepseek-v3.json").read_text()).items()
        if k != "quantization_config"
    }
    | {"num_hidden_layers": 4},
}


def _compile(fn, *args, target, donate):
    return compile_for_gpu(fn, *args, target=target, donate_argnums=donate, dump_dir=True,
                           no_spills=False)  # fmt: skip


def _plain_runs(m) -> bool:
    return set(m.arch.kinds) <= {
        "attention",
        "mla",
        "mlp",
        "moe",
        "mamba",
        "gdn",
    }  # the plain step's blocks


def decode_costs(raw, *, batch, target, plain=True, max_seq_len=4096):
    m = build_model(raw, max_batch_tokens=2048, max_seq_len=max_seq_len, max_batch_size=batch)
    per = max_seq_len // m.kv_block_size
    params = abstract_params(m)
    caches = abstract_caches(m, num_blocks=batch * per, rows=batch)
    v, tables = S((batch,), I32), S((batch, per), I32)
    arena = S(m.plan.arena_shape, U8)
    a = _compile(m.decode_step, params, arena, caches, v, v, tables, v, target=target,
                 donate=(1, 2))  # fmt: skip
    out = {"arena": a, "arena_bytes": m.plan.total_bytes, "layers": len(m.arch.blocks)}
    if plain and _plain_runs(m):
        fn = functools.partial(plain_decode_step, m)
        out["plain"] = _compile(fn, params, caches, v, v, tables, v, target=target, donate=(1,))
    return out


def prefill_costs(raw, *, tokens, target, plain=False, batch=8, chunk="auto"):
    m = build_model(raw, max_batch_tokens=tokens, max_seq_len=tokens, max_batch_size=batch)
    m = dataclasses.replace(m, prefill_chunk=chunk)
    per = tokens // m.kv_block_size
    params = abstract_params(m)
    caches = abstract_caches(m, num_blocks=(batch + 1) * per, rows=batch + 1)
    tok, cu, tables = S((tokens,), I32), S((batch + 2,), I32), S((batch + 1, per), I32)
    arena = S(m.plan.arena_shape, U8)
    a = _compile(m.prefill, params, arena, caches, tok, cu, tables, target=target, donate=(1, 2))
    out = {"arena": a, "arena_bytes": m.plan.total_bytes}
    if plain and _plain_runs(m):
        fn = functools.partial(plain_prefill, m)
        out["plain"] = _compile(fn, params, caches, tok, cu, tables, target=target, donate=(1,))
    return out


def _fig(c):
    return (f"temp {c.temp_bytes / 2**20:9.2f} MiB  launches {c.launches:6d}  spills "
            f"{c.max_spill_bytes}  compile {c.compile_seconds:6.1f} s")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h200")
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers")
    ap.add_argument("--tokens", nargs="+", type=int, default=[2048, 8192])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prefill-chunk", default="auto",
                    help="ArenaLM.prefill_chunk: 'auto', 'none' (one pass) or a token count")  # fmt: skip
    ap.add_argument("--skip", nargs="*", default=[], choices=["prefill", "decode", "plain"])
    args = ap.parse_args()
    chunk = args.prefill_chunk
    chunk = None if chunk == "none" else chunk if chunk == "auto" else int(chunk)
    for name in args.models:
        raw = dict(MODELS[name])
        if args.layers:
            raw["num_hidden_layers"] = args.layers
        n = raw["num_hidden_layers"]
        print(f"== {name} ({n} layers, hidden {raw['hidden_size']}) on {args.target}")
        if "decode" not in args.skip:
            d = decode_costs(raw, batch=args.batch, target=args.target,
                             plain="plain" not in args.skip)  # fmt: skip
            print(f"decode B={args.batch} arena: {_fig(d['arena'])}  per layer "
                  f"{d['arena'].launches / n:.1f}")  # fmt: skip
            if "plain" in d:
                print(f"decode B={args.batch} plain: {_fig(d['plain'])}  per layer "
                      f"{d['plain'].launches / n:.1f}  ratio "
                      f"{d['arena'].launches / d['plain'].launches:.3f}")  # fmt: skip
        if "prefill" not in args.skip:
            for t in args.tokens:
                p = prefill_costs(raw, tokens=t, target=args.target,
                                  plain="plain" not in args.skip, chunk=chunk)  # fmt: skip
                a = p["arena"]
                print(f"prefill T={t} arena: {_fig(a)}  arena {p['arena_bytes'] / 2**20:.1f} "
                      f"MiB, temp/arena {a.temp_bytes / p['arena_bytes']:.3f}")  # fmt: skip
                if "plain" in p:
                    print(f"prefill T={t} plain: {_fig(p['plain'])}  ratio "
                          f"{a.launches / p['plain'].launches:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
